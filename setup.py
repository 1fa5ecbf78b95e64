"""Builds the compiled payment path (``handlers/_fastcore.pyx``); everything else is in
pyproject.toml. Without a C compiler the build goes on without it (``optional``), and
limitflow decides every event in Python, the same way, only slower."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = cythonize(
    [Extension("handlers._fastcore", ["handlers/_fastcore.pyx"])],
    compiler_directives={"language_level": "3"},
)
for extension in extensions:
    extension.optional = True  # cythonize's copies do not keep the flag given to Extension

setup(ext_modules=extensions)
