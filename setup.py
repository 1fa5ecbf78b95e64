"""Builds the compiled twins of limitflow's hot paths: the payment path
(``handlers/_fastcore.pyx``, with ``handlers/_slots``), the common-event parser
(``schemas/_fastparse.pyx``), the memory store's read and write
(``stores/_fastmemory.pyx``, with ``stores/_shapes.pyx`` for its records' verdicts),
the sqlite store's row building (``stores/_fastsqlite.pyx``) and Kafka's default
partitioner (``streams/_fastkafka.pyx``); everything else is in
pyproject.toml. Without a C compiler the build goes on without them (``optional``), and
limitflow parses, decides and keeps every event in Python, the same way, only slower."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = cythonize(
    [
        Extension("handlers._slots", ["handlers/_slots.pyx"]),
        Extension("handlers._fastcore", ["handlers/_fastcore.pyx"]),
        Extension("stores._fastmemory", ["stores/_fastmemory.pyx"]),
        Extension("stores._shapes", ["stores/_shapes.pyx"]),
        Extension("schemas._fastparse", ["schemas/_fastparse.pyx"]),
        Extension("streams._fastkafka", ["streams/_fastkafka.pyx"]),
        Extension("stores._fastsqlite", ["stores/_fastsqlite.pyx"]),
    ],
    compiler_directives={"language_level": "3"},
)
for extension in extensions:
    extension.optional = True  # cythonize's copies do not keep the flag given to Extension

setup(ext_modules=extensions)
