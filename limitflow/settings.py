"""Settings of the Kafka runtime: one frozen object, built once at the edge.

Every option of ``limitflow run`` and ``limitflow topics create`` has an environment
variable ``LIMITFLOW_<NAME>`` (``--input-topic`` ↔ ``LIMITFLOW_INPUT_TOPIC``). A command
line flag overrides the environment, which overrides the default. Only ``load_*`` read
an environment mapping, and it is handed in: nothing below the edge calls ``os.getenv``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from limitflow.errors import ConfigError

ENV_PREFIX = "LIMITFLOW_"
DEFAULT_STORE = "sqlite:///limitflow.db"
MAX_MESSAGE_BYTES: Final = 1_000_000
"""Largest record ``run`` publishes, and line ``replay`` reads, unless told."""


class Guarantee(enum.StrEnum):
    """What a reader of the output topic can rely on."""

    AT_LEAST_ONCE = "at-least-once"
    """Offsets are committed after verdicts are delivered; a crash may publish a verdict
    again (always the identical one), never lose one."""
    EXACTLY_ONCE = "exactly-once"
    """Verdicts and offsets are committed in one Kafka transaction per input partition;
    ``read_committed`` readers see each verdict once."""


SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """How the Kafka clients prove who they are and protect what they send: TLS and
    SASL, as Kafka's own clients name them (``security.protocol``, ``sasl.mechanism``)."""

    security_protocol: str = "PLAINTEXT"
    """``SECURITY_PROTOCOLS``: TLS (``SSL``), SASL, both, or neither."""
    sasl_mechanism: str = ""
    """``SASL_MECHANISMS``; required with a ``SASL_*`` protocol."""
    sasl_username: str = ""
    sasl_password: str = dataclasses.field(default="", repr=False)
    """From the environment only (``LIMITFLOW_SASL_PASSWORD``): a flag's value would
    show in the process list. Never logged or shown."""
    ssl_cafile: str = ""
    """CA certificates (PEM) the brokers' certificates are checked against; empty: the
    system's. Brokers' host names are checked too."""
    ssl_certfile: str = ""
    """This client's certificate chain (PEM), for brokers that require one (mTLS)."""
    ssl_keyfile: str = ""
    """Its private key (PEM); empty: in ``ssl_certfile``."""

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")


def check_security(security: KafkaSecurity) -> None:
    """Refuse what would leave a client unable to connect, or connected with less
    protection than asked for (a CA file given while TLS is off, say), at start."""
    if security.security_protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(
            f"security_protocol ({env_name('security_protocol')}) must be one of"
            f" {', '.join(SECURITY_PROTOCOLS)}, not {security.security_protocol!r}"
        )
    if not security.sasl:
        sasl = ("sasl_mechanism", "sasl_username", "sasl_password")
        given = [name for name in sasl if getattr(security, name)]
        if given:
            raise ConfigError(
                f"{', '.join(given)} set, but security_protocol"
                f" ({env_name('security_protocol')}) is {security.security_protocol}: use"
                " SASL_SSL (or SASL_PLAINTEXT) for SASL"
            )
    elif security.sasl_mechanism not in SASL_MECHANISMS:
        raise ConfigError(
            f"sasl_mechanism ({env_name('sasl_mechanism')}) must be one of"
            f" {', '.join(SASL_MECHANISMS)} with {security.security_protocol},"
            f" not {security.sasl_mechanism!r}"
        )
    else:
        for name in ("sasl_username", "sasl_password"):
            if not getattr(security, name):
                raise ConfigError(f"{name} ({env_name(name)}) is required with SASL")
    files = [n for n in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(security, n)]
    if files and not security.tls:
        raise ConfigError(
            f"{', '.join(files)} set, but security_protocol ({env_name('security_protocol')})"
            f" is {security.security_protocol}: use SSL or SASL_SSL for TLS"
        )
    if security.ssl_keyfile and not security.ssl_certfile:
        raise ConfigError(
            f"ssl_keyfile ({env_name('ssl_keyfile')}) needs ssl_certfile"
            f" ({env_name('ssl_certfile')}), the certificate it is the key of"
        )
    if security.tls:
        tls_context(security)  # files that cannot be read or used: refused at start


class _EncryptedKey(Exception):
    """The private key asks for a passphrase (``_no_passphrase``)."""


def _no_passphrase() -> str:
    raise _EncryptedKey


def tls_context(security: KafkaSecurity) -> ssl.SSLContext:
    """The TLS context of every Kafka client (as aiokafka's ``create_ssl_context`` makes
    it): brokers' certificates and host names checked against ``ssl_cafile`` or the
    system's CAs, and this client's certificate offered when one is given. Files that
    cannot be read or used are a ``ConfigError`` naming them."""
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=security.ssl_cafile or None
        )
        if security.ssl_certfile:
            # no passphrase is taken: OpenSSL's own prompt for one, on the terminal, held
            # a start (once per client), and without a terminal its failure said only
            # "[Errno 22] Invalid argument"
            context.load_cert_chain(
                security.ssl_certfile, security.ssl_keyfile or None, password=_no_passphrase
            )
    except _EncryptedKey:
        name = "ssl_keyfile" if security.ssl_keyfile else "ssl_certfile"
        raise ConfigError(
            f"TLS: {name} ({env_name(name)}) {getattr(security, name)}: the private key is"
            " encrypted; limitflow takes an unencrypted one (PEM), kept as a secret"
        ) from None
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(
            f"{name} ({env_name(name)}) {getattr(security, name)}"
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
            if getattr(security, name)
        )
        raise ConfigError(f"TLS: {files or 'the system CA certificates'}: {exc}") from None
    return context


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """How to reach the brokers and which topics to use."""

    bootstrap_servers: str
    """Comma-separated ``HOST:PORT`` list."""
    input_topic: str
    output_topic: str
    dead_letter_topic: str
    client_id: str = "limitflow"
    request_timeout_ms: int = 30_000
    """Per request to a broker; a slower broker counts as unavailable and is retried."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """Largest record limitflow publishes (Kafka's default ``message.max.bytes`` is
    1,048,588). A dead letter that would be larger names its original record by size
    and SHA-256 instead of repeating it; the record stays at its topic/partition/offset.
    A broker takes a record batch up to the same size: each batch published is as large
    as this allows (``streams.output.batch_bytes``)."""
    compression: str = "zstd"
    """Codec of the record batches published (``COMPRESSIONS``). Verdicts are JSON that
    repeats its field names and rule ids: zstd made a partition's batch of the benchmark's
    verdicts 20 times smaller (real traffic varies more and compresses less),
    for the brokers' disks and every reader of the topic, and `run` published faster on
    this project's benchmark. Readers need a Kafka client that reads zstd (Apache
    Kafka's since 2.1, librdkafka, aiokafka with cramjam); ``none`` for those that cannot."""
    security: KafkaSecurity = KafkaSecurity()
    """TLS and SASL of every client (consumer, producers, admin)."""


COMPRESSIONS: Final = ("zstd", "lz4", "snappy", "gzip", "none")
"""What ``compression`` takes: the codecs of the Kafka protocol, or none."""


def check_compression(value: str) -> None:
    """Refuse a ``compression`` that is not a Kafka codec (or ``none``)."""
    if value not in COMPRESSIONS:
        raise ConfigError(
            f"compression ({env_name('compression')}) must be one of {', '.join(COMPRESSIONS)},"
            f" not {value!r}"
        )


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """What ``limitflow topics create`` (and ``run --create-topics``) creates."""

    kafka: KafkaSettings
    partitions: int = 6
    replication_factor: int = 1


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Everything ``limitflow run`` needs."""

    kafka: KafkaSettings
    group_id: str
    rules: str
    """Path of the rules file (YAML)."""
    store: str = DEFAULT_STORE
    """State store URL, as ``open_store`` takes it."""
    guarantee: Guarantee = Guarantee.AT_LEAST_ONCE
    http_port: int = 0
    """Port of ``/healthz``, ``/readyz`` and ``/metrics`` on ``http_host``; 0 turns it off."""
    http_host: str = "127.0.0.1"
    create_topics: bool = False
    """Create missing topics at start (with ``partitions`` and ``replication_factor``)."""
    partitions: int = 6
    replication_factor: int = 1
    batch_size: int = 2_000
    """Most records taken by one ``getmany``, decided and committed together."""
    poll_timeout_ms: int = 500
    """How long one ``getmany`` waits for records; bounds how late a stop is noticed."""
    fetch_max_wait_ms: int = 50
    """Longest a broker may hold a fetch that found no records. Apache Kafka answers as
    soon as records arrive; a broker that does not (tansu) adds up to this much to an
    event's latency, so it is kept well under the latency budget (Kafka's default: 500)."""
    session_timeout_ms: int = 10_000
    max_poll_interval_ms: int = 300_000
    retry_initial_ms: int = 200
    """First wait after a retriable failure; doubled on each further failure."""
    retry_max_ms: int = 30_000
    shutdown_grace_ms: int = 20_000
    """On SIGTERM, how long a batch whose store or broker is down (or does not answer)
    may hold the stop before it is left uncommitted (it is then redelivered and
    deduplicated). With the Kafka clients' hurried close (2 s each) the stop fits in
    Kubernetes' default termination grace of 30 s."""
    log_level: str = "INFO"
    log_format: str = "json"
    """``json`` (one object a line) or ``text``."""

    @property
    def topics(self) -> TopicSettings:
        """The topic layout this run creates with ``--create-topics``."""
        return TopicSettings(self.kafka, self.partitions, self.replication_factor)


_T = TypeVar("_T")


def env_name(option: str) -> str:
    """``input_topic`` → ``LIMITFLOW_INPUT_TOPIC``."""
    return ENV_PREFIX + option.upper()


def whole_number(raw: str) -> int:
    """``raw`` (spaces around it aside) as an ``int`` of ASCII digits, maybe negative: the
    flags' as the variables' (``int`` took ``1_000``, ``+5`` and other scripts' digits)."""
    text = raw.strip()
    if not text.lstrip("-").isdigit() or not text.isascii():
        raise ValueError(f"expected a whole number, got {raw!r}")
    return int(text)


def _convert(name: str, raw: Any, kind: Any) -> Any:
    """``raw`` (a string from the environment, or a parsed flag) as type ``kind``."""
    if not isinstance(raw, str) or name == "sasl_password":  # a password is as given
        return raw
    text = raw.strip()
    try:
        if kind in (int, "int"):
            return whole_number(raw)
        if kind in (bool, "bool"):
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        if kind in (Guarantee, "Guarantee"):
            if text not in set(Guarantee):
                choices = ", ".join(Guarantee)
                raise ValueError(f"must be one of {choices}, not {raw!r}")
            return Guarantee(text)
    except ValueError as exc:
        raise ConfigError(f"{name} ({env_name(name)}): {exc}") from None
    return text


def _build(cls: type[_T], values: Mapping[str, Any], env: Mapping[str, str], **given: Any) -> _T:
    """An instance of ``cls``: flag value, else environment, else the field's default."""
    kwargs: dict[str, Any] = dict(given)
    missing: list[str] = []
    for spec in dataclasses.fields(cls):  # type: ignore[arg-type]
        if spec.name in given:
            continue
        raw = values.get(spec.name)
        if raw is None:
            raw = env.get(env_name(spec.name))
        if raw is None:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                missing.append(spec.name)
            continue
        kwargs[spec.name] = _convert(spec.name, raw, spec.type)
    if missing:
        needed = ", ".join(f"--{n.replace('_', '-')} ({env_name(n)})" for n in missing)
        raise ConfigError(_missing(needed, env))
    return cls(**kwargs)


def _missing(needed: str, env: Mapping[str, str]) -> str:
    """The reason for required settings not given, naming the ``LIMITFLOW_*`` variables
    set that no setting reads: the warning that names them comes only once the settings
    are loaded, and a misspelt one is the likeliest cause."""
    unknown = unknown_variables(env)
    if not unknown:
        return f"missing required settings: {needed}"
    which = ", ".join(unknown)
    return (
        f"missing required settings: {needed} ({which} {'is' if len(unknown) == 1 else 'are'}"
        " set, but not a limitflow setting: misspelt?)"
    )


def _require(
    classes: tuple[type[Any], ...],
    values: Mapping[str, Any],
    env: Mapping[str, str],
    *,
    flags: bool = True,
) -> None:
    """Raise one ``ConfigError`` naming every required setting given neither way."""
    missing = [
        spec.name
        for cls in classes
        for spec in dataclasses.fields(cls)
        if spec.default is dataclasses.MISSING
        and spec.default_factory is dataclasses.MISSING
        and spec.name != "kafka"
        and values.get(spec.name) is None
        and env.get(env_name(spec.name)) is None
    ]
    if missing:
        needed = ", ".join(
            f"--{n.replace('_', '-')} ({env_name(n)})" if flags else env_name(n) for n in missing
        )
        raise ConfigError(_missing(needed, env))


_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
"""What Kafka takes as a topic name (and not "." or "..")."""


def check_topics(input_topic: str, output_topic: str, dead_letter_topic: str) -> None:
    """Refuse a name Kafka does not take (an empty variable gave topic "", which tansu
    created), and a layout that would read its own output."""
    for name, topic in (
        ("input_topic", input_topic),
        ("output_topic", output_topic),
        ("dead_letter_topic", dead_letter_topic),
    ):
        if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            raise ConfigError(
                f"{name} ({env_name(name)}): {topic!r} is not a Kafka topic name"
                " (1 to 249 letters, digits, '.', '_' or '-')"
            )
    if len({input_topic, output_topic, dead_letter_topic}) != 3:
        raise ConfigError("input, output and dead-letter topics must be three different topics")


def check_group(group_id: str) -> None:
    """Refuse an empty consumer group: an empty variable ran a consumer in group ""."""
    if not group_id.strip():
        raise ConfigError(f"group_id ({env_name('group_id')}): must not be empty")


STORE_PASSWORD: Final = "store_password"  # noqa: S105 - a variable's name
"""``LIMITFLOW_STORE_PASSWORD``: the password of a MongoDB store whose URL names its user
alone (``mongodb://app@host/db``), for every command: a password in a command's
``--store`` is in the process list (``ps``) and the shell's history."""


def store_password(env: Mapping[str, str]) -> str | None:
    """``LIMITFLOW_STORE_PASSWORD`` of ``env``, None when not set (or empty)."""
    return env.get(env_name(STORE_PASSWORD)) or None


FAUST_ONLY: Final = ("batch_wait_ms", "web_port", "web_bind", "data_dir")
"""Settings of the faust app (``streams.faust_app.FaustSettings``) that ``run`` has not;
named here so that ``run`` need not import faust to know them (a test keeps them true)."""
TEST_VARIABLES: Final = (
    "TEST_SERVERS",
    "SERVERS_DIR",
    "SERVER_START_TIMEOUT",
    "KEEP_SERVER_LOGS",
    "TANSU_BIN",
    "NOIDA_BIN",
    "DYNAMODB_JAVA_OPTS",
    "MONGO_URI",
    "ORACLE_SEED",
)
"""``LIMITFLOW_*`` variables read by the test servers (``tests/servers.py``) and the tests
(``tests/unit/test_oracle.py``), not settings."""


METADATA_MAX_AGE_MS: Final = 30_000
"""How often a consumer (``run``'s, the faust app's) refreshes its metadata at the latest
(aiokafka's and faust's default: 5 minutes): the time a partition added to the input
topic waits to be assigned."""


GROUPS: Final = ("kafka", "security")
"""Fields that hold a group of settings (``KafkaSettings``, ``KafkaSecurity``): no
variable is read for them."""


def setting_variables(*classes: type[Any]) -> set[str]:
    """The ``LIMITFLOW_*`` variable of each setting of the dataclasses ``classes`` (not of
    their groups of settings)."""
    return {
        env_name(spec.name)
        for cls in classes
        for spec in dataclasses.fields(cls)
        if spec.name not in GROUPS
    }


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """``LIMITFLOW_*`` variables that no limitflow setting is read from: a misspelt one
    (``LIMITFLOW_GUARANTE=exactly-once``) was ignored without a word."""
    known = setting_variables(KafkaSettings, KafkaSecurity, RunSettings, TopicSettings)
    known.update(env_name(name) for name in (*FAUST_ONLY, *TEST_VARIABLES, STORE_PASSWORD))
    return sorted(name for name in env if name.startswith(ENV_PREFIX) and name not in known)


def load_env_settings(cls: type[_T], env: Mapping[str, str]) -> _T:
    """The dataclass ``cls`` from ``LIMITFLOW_*`` variables over its defaults.

    For runtimes configured by the environment alone (the faust app).
    """
    _require((cls,), {}, env, flags=False)
    return _build(cls, {}, env)


def check_bootstrap(servers: str) -> None:
    """Refuse a bootstrap list with an empty or malformed ``HOST:PORT`` (a trailing comma
    made aiokafka fall back to localhost:9092, another broker than the one named)."""
    for host_port in servers.split(","):
        host, sep, port = host_port.strip().rpartition(":")
        # a port past 65535 reached the socket's connect(): a traceback, not one line
        if (
            not sep
            or not host
            or not (port.isascii() and port.isdigit() and 0 < int(port) < 65_536)
        ):
            raise ConfigError(
                f"bootstrap_servers ({env_name('bootstrap_servers')}): expected"
                f" HOST:PORT[,HOST:PORT…], got {servers!r}"
            )


def load_security(values: Mapping[str, Any], env: Mapping[str, str]) -> KafkaSecurity:
    """``KafkaSecurity`` from parsed flags (None = not given) over ``env``, checked."""
    security = _build(KafkaSecurity, values, env)
    check_security(security)
    return security


def _kafka(values: Mapping[str, Any], env: Mapping[str, str]) -> KafkaSettings:
    settings = _build(KafkaSettings, values, env, security=load_security(values, env))
    check_bootstrap(settings.bootstrap_servers)
    check_topics(settings.input_topic, settings.output_topic, settings.dead_letter_topic)
    check_compression(settings.compression)
    return settings


def check_retry(initial_ms: int, max_ms: int) -> None:
    """Refuse a backoff whose longest wait is shorter than its first."""
    if max_ms < initial_ms:
        raise ConfigError(
            f"retry_max_ms ({env_name('retry_max_ms')}) must be at least retry_initial_ms"
            f" ({env_name('retry_initial_ms')}): {max_ms} < {initial_ms}"
        )


def check_positive(name: str, value: int, *, zero_ok: bool = False) -> None:
    """Refuse a count or duration below 1 (below 0 with ``zero_ok``)."""
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{name} ({env_name(name)}) must be {'>= 0' if zero_ok else '> 0'}")


LOG_LEVELS: Final = tuple(logging.getLevelNamesMapping())
"""What ``logging`` takes: DEBUG, INFO, WARNING (WARN), ERROR, CRITICAL (FATAL), NOTSET."""


def load_run_settings(values: Mapping[str, Any], env: Mapping[str, str]) -> RunSettings:
    """``RunSettings`` from parsed flags (None = not given) over ``env`` over defaults."""
    _require((KafkaSettings, RunSettings), values, env)
    kafka = _kafka(values, env)
    settings = _build(RunSettings, values, env, kafka=kafka)
    check_group(settings.group_id)
    for name in (
        "batch_size",
        "poll_timeout_ms",
        "fetch_max_wait_ms",
        "partitions",
        "replication_factor",
        "retry_initial_ms",
        "retry_max_ms",
        "session_timeout_ms",
        "max_poll_interval_ms",
    ):
        check_positive(name, getattr(settings, name))
    check_retry(settings.retry_initial_ms, settings.retry_max_ms)
    check_positive("request_timeout_ms", kafka.request_timeout_ms)
    check_positive("shutdown_grace_ms", settings.shutdown_grace_ms, zero_ok=True)
    check_positive("max_message_bytes", kafka.max_message_bytes)
    if not 0 <= settings.http_port <= 65_535:
        raise ConfigError(f"http_port ({env_name('http_port')}) must be 0..65535")
    if not settings.http_host:
        # asyncio takes an empty host for every interface: a blank template variable
        # put /metrics before the whole network instead of 127.0.0.1
        raise ConfigError(
            f"http_host ({env_name('http_host')}) must name an address (0.0.0.0 for every"
            " interface)"
        )
    if settings.log_format not in ("json", "text"):
        raise ConfigError(f"log_format ({env_name('log_format')}) must be json or text")
    if settings.log_level.upper() not in LOG_LEVELS:
        raise ConfigError(
            f"log_level ({env_name('log_level')}) must be one of {', '.join(LOG_LEVELS)}"
        )
    return settings


def load_topic_settings(values: Mapping[str, Any], env: Mapping[str, str]) -> TopicSettings:
    """``TopicSettings`` from parsed flags (None = not given) over ``env`` over defaults."""
    kafka = _kafka(values, env)
    settings = _build(TopicSettings, values, env, kafka=kafka)
    check_positive("partitions", settings.partitions)
    check_positive("replication_factor", settings.replication_factor)
    # as `run` checks them: a request timeout of 0 said the brokers could not be reached
    check_positive("request_timeout_ms", kafka.request_timeout_ms)
    check_positive("max_message_bytes", kafka.max_message_bytes)
    return settings
