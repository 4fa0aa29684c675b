#!/usr/bin/env bash
# Makes the servers the tests need available on loopback, and prints their URLs.
#
# Installs what DEBIAN_PACKAGES lists and the machine lacks (as root, or with sudo; without
# either it fails and names the packages), uses a server that is already running or starts
# it, and creates the test databases. Safe to run again and again.
#
#   scripts/services.sh              everything below; prints NAME=VALUE lines
#   scripts/services.sh --packages   prints the Debian packages it needs, on one line
#
#   PostgreSQL  postgres://postgres@127.0.0.1:5432/test   (trust auth on loopback)
#   MariaDB     mysql://root@127.0.0.1:3306/test          (root, empty password)
#   Redis       redis://127.0.0.1:6379/                   (no persistence; redis-server is
#               also needed as a binary: some tests start private servers on other ports)
#   RabbitMQ    amqp://guest:guest@127.0.0.1:5672/outbox-test   (vhost `outbox-test`;
#               rabbitmqctl must work for the tests that close connections or stop the app)
#   NATS        nats://127.0.0.1:4222   (JetStream on, file storage in /var/lib/nats-server or
#               ~/.cache/outbox-tools/nats; the tests also start private servers on other
#               ports with the binary OUTBOX_TEST_NATS_SERVER names)
#   MQTT        mqtt://127.0.0.1:1883   (mosquitto, anonymous clients on loopback; the tests also
#               start private brokers on other ports with the binary OUTBOX_TEST_MOSQUITTO names)
#   Kafka       127.0.0.1:9092   (tansu, a Kafka-protocol broker, in memory; built once with
#               cargo install into ~/.cache/outbox-tools; the tests also start private
#               brokers on other ports with the binary OUTBOX_TEST_TANSU names). With
#               OUTBOX_SERVICES_KAFKA=background and tansu not built yet, the build starts
#               in the background and a later run of this script waits for it and starts
#               the broker.
#   SQS         http://127.0.0.1:4566   (moto_server from PyPI, an SQS emulator in memory, in a
#               virtualenv under ~/.cache/outbox-tools; queues `outbox-test` and
#               `outbox-test.fifo`; the tests also start private emulators with the binary
#               OUTBOX_TEST_MOTO names)
#   Python and Node with the drivers the foreign-writer tests use (see ensure_writers)
#   Chromium (Debian) and playwright-core (npm) for the dashboard's browser test
#   libpq and libmariadb (Debian's -dev packages), which diesel's connections link to;
#   libfaketime, which skews a relay's clock in the battery's clock-skew fault; debootstrap
#   for scripts/fresh-root.sh; systemd for systemd-analyze, which scripts/check-deploy.sh
#   runs on the relay's unit file (systemd need not be running)
set -euo pipefail

# Every Debian package the tests need; the README's "Testing" section shows this list.
DEBIAN_PACKAGES=(
    postgresql postgresql-client mariadb-server mariadb-client redis-server rabbitmq-server
    nats-server mosquitto build-essential pkg-config libpq-dev libmariadb-dev libmariadb-dev-compat libfaketime
    python3 python3-venv nodejs npm curl chromium debootstrap systemd
)

if [[ ${1:-} == --packages ]]; then
    echo "${DEBIAN_PACKAGES[*]}"
    exit 0
fi

log() { printf '[services] %s\n' "$*" >&2; }

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

# Whether a package of DEBIAN_PACKAGES is there: its program where it has one (whoever
# installed it, and whatever versioned package brought it), else dpkg's word.
present() {
    case $1 in
    postgresql) compgen -G '/usr/lib/postgresql/*/bin/postgres' ;;
    postgresql-client) command -v psql && command -v pg_isready ;;
    mariadb-server) test -x /usr/sbin/mariadbd ;;
    mariadb-client) command -v mariadb && command -v mariadb-admin ;;
    redis-server) test -x /usr/bin/redis-server && command -v redis-cli ;;
    rabbitmq-server) test -x /usr/sbin/rabbitmq-server && command -v rabbitmqctl ;;
    nats-server) test -x /usr/sbin/nats-server ;;
    mosquitto) test -x /usr/sbin/mosquitto ;;
    chromium) test -x /usr/bin/chromium ;;
    build-essential) command -v cc && command -v make ;;
    python3) command -v python3 ;;
    python3-venv) python3 -c 'import ensurepip, venv' ;;
    nodejs) command -v node ;;
    systemd) command -v systemd-analyze ;;
    npm | curl | debootstrap | pkg-config) command -v "$1" ;;
    *) [[ $(dpkg-query -W -f '${Status}' "$1" 2>/dev/null) == *" installed" ]] ;;
    esac >/dev/null 2>&1
}

ensure_packages() {
    local missing=() package
    for package in "${DEBIAN_PACKAGES[@]}"; do
        present "$package" || missing+=("$package")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) -ne 0 ]] && ! sudo -n true 2>/dev/null; then
        log "missing Debian packages, and neither root nor sudo to install them: ${missing[*]}"
        log "install them with: sudo apt-get install ${missing[*]}"
        exit 1
    fi
    log "installing Debian packages: ${missing[*]}"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
        ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; then
        log "could not install the Debian packages: ${missing[*]}"
        log "install them with: sudo apt-get install ${missing[*]}"
        exit 1
    fi
}

wait_for() { # description, seconds, command...
    local what=$1 seconds=$2
    shift 2
    for _ in $(seq "$((seconds * 5))"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    log "$what did not come up within ${seconds}s"
    return 1
}

ensure_postgres() {
    if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
        local version
        version=$(ls /etc/postgresql | sort -V | tail -1)
        local hba="/etc/postgresql/$version/main/pg_hba.conf"
        # Test machines only: trust local and loopback connections.
        if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
            log "configuring trust authentication on loopback ($hba)"
            as_root sh -c "printf 'local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' > '$hba'"
        fi
        log "starting PostgreSQL $version"
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
        wait_for PostgreSQL 30 pg_isready -q -h 127.0.0.1 -p 5432
    fi
    # Commit timestamps: the relay measures commit-to-publish latency from the commit with
    # them (decision 0026); the setting needs a restart.
    # Connections: tests run two at a time, each suite check with a pool of its own, and
    # a test that stops early leaves its connections to close; 100 is too tight (also
    # needs a restart).
    if [[ $(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SHOW track_commit_timestamp") != on ||
          $(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SHOW max_connections") -lt 300 ]]; then
        log "turning on track_commit_timestamp, allowing 300 connections, restarting PostgreSQL"
        psql -h 127.0.0.1 -U postgres -d postgres -qc "ALTER SYSTEM SET track_commit_timestamp = on"
        psql -h 127.0.0.1 -U postgres -d postgres -qc "ALTER SYSTEM SET max_connections = 300"
        as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main restart
        wait_for PostgreSQL 30 pg_isready -q -h 127.0.0.1 -p 5432
    fi
    if [[ -z $(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = 'test'") ]]; then
        log "creating database test"
        psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE test"
    fi
    echo "OUTBOX_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test"
}

mariadb_up() { mariadb-admin -h 127.0.0.1 -P 3306 -u root ping; }

ensure_mariadb() {
    if ! command -v mariadb-admin >/dev/null || ! mariadb_up >/dev/null 2>&1; then
        log "starting MariaDB"
        as_root mkdir -p /run/mysqld
        as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
        as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
        wait_for MariaDB 60 as_root mariadb-admin ping
        # A fresh Debian install lets root in only through the unix socket; the tests
        # connect over TCP as root with an empty password.
        if ! mariadb_up >/dev/null 2>&1; then
            log "allowing root over loopback TCP with an empty password (test machines only)"
            as_root mariadb -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket; CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; FLUSH PRIVILEGES;"
        fi
        wait_for "MariaDB over TCP" 30 mariadb_up
    fi
    mariadb -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE IF NOT EXISTS test"
    echo "OUTBOX_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test"
}

redis_up() { [[ $(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null) == PONG ]]; }

ensure_redis() {
    # The sink tests also run /usr/bin/redis-server themselves (restarts, replicas).
    if ! redis_up; then
        log "starting Redis"
        redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
            --dir /tmp --logfile /tmp/outbox-redis-6379.log >/dev/null
        wait_for Redis 30 redis_up
    fi
    echo "OUTBOX_TEST_REDIS_URL=redis://127.0.0.1:6379/"
}

rabbitmq_up() { as_root rabbitmqctl -q await_startup --timeout 5; }

ensure_rabbitmq() {
    if ! rabbitmq_up >/dev/null 2>&1; then
        if as_root rabbitmqctl -q ping >/dev/null 2>&1; then
            # The node runs but its app is stopped: a broker-fault test was killed before
            # its guard could start the app again.
            log "starting RabbitMQ's app (the node was up with the app stopped)"
            as_root rabbitmqctl -q start_app >/dev/null 2>&1 || true
        else
            log "starting RabbitMQ"
            as_root sh -c 'rabbitmq-server -detached' >/dev/null 2>&1 || true
        fi
        wait_for RabbitMQ 90 rabbitmq_up
    fi
    if ! as_root rabbitmqctl -q list_vhosts | grep -qx outbox-test; then
        log "creating RabbitMQ vhost outbox-test"
        as_root rabbitmqctl -q add_vhost outbox-test
    fi
    as_root rabbitmqctl -q set_permissions -p outbox-test guest '.*' '.*' '.*'
    echo "OUTBOX_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/outbox-test"
}

nats_up() { (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; }

ensure_nats() {
    if ! nats_up; then
        local store=$TOOLS_DIR/nats
        mkdir -p "$store"
        log "starting nats-server with JetStream on 127.0.0.1:4222 (store: $store)"
        setsid -f /usr/sbin/nats-server -a 127.0.0.1 -p 4222 -js -sd "$store" \
            >"$store/nats-server.log" 2>&1 </dev/null
        wait_for "nats-server (4222)" 30 nats_up
    fi
    echo "OUTBOX_TEST_NATS_URL=nats://127.0.0.1:4222"
    echo "OUTBOX_TEST_NATS_SERVER=/usr/sbin/nats-server"
}

mqtt_up() { (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null; }

ensure_mqtt() {
    if ! mqtt_up; then
        local dir=$TOOLS_DIR/mosquitto
        mkdir -p "$dir"
        printf 'listener 1883 127.0.0.1\nallow_anonymous true\nuser %s\n' "$(id -un)" >"$dir/mosquitto.conf"
        log "starting mosquitto on 127.0.0.1:1883"
        setsid -f /usr/sbin/mosquitto -c "$dir/mosquitto.conf" >"$dir/mosquitto.log" 2>&1 </dev/null
        wait_for "mosquitto (1883)" 30 mqtt_up
    fi
    echo "OUTBOX_TEST_MQTT_URL=mqtt://127.0.0.1:1883"
    echo "OUTBOX_TEST_MOSQUITTO=/usr/sbin/mosquitto"
}

# tansu (crates.io) speaks the Kafka protocol and keeps topics in memory (or in SQLite,
# for the broker-restart test). Built once per machine; `--locked` because newer
# dependency releases break its build.
TOOLS_DIR=${OUTBOX_TOOLS_DIR:-$HOME/.cache/outbox-tools}
TANSU_VERSION=0.6.0

kafka_up() { (exec 3<>/dev/tcp/127.0.0.1/9092) 2>/dev/null; }

tansu_built() { [[ -x $1 && $("$1" --version 2>/dev/null) == *"$TANSU_VERSION"* ]]; }

ensure_kafka() {
    local tansu=$TOOLS_DIR/bin/tansu lock=$TOOLS_DIR/tansu-build.lock
    local build_log=$TOOLS_DIR/tansu-build.log
    # Its own target directory: a build in the background must not hold the lock of the
    # caller's (CARGO_TARGET_DIR), nor leave tansu's objects in it.
    local build=(env CARGO_TARGET_DIR="$TOOLS_DIR/tansu-target" cargo install tansu --locked
        --quiet --version "$TANSU_VERSION" --features dynostore,libsql --root "$TOOLS_DIR")
    mkdir -p "$TOOLS_DIR"
    if ! tansu_built "$tansu"; then
        if [[ ${OUTBOX_SERVICES_KAFKA:-} == background ]]; then
            if flock -n "$lock" true; then
                log "building tansu $TANSU_VERSION in the background (log: $build_log)"
                setsid -f flock "$lock" nice -n 10 "${build[@]}" >"$build_log" 2>&1 </dev/null
            fi
            echo "OUTBOX_TEST_KAFKA_BROKERS=127.0.0.1:9092"
            echo "OUTBOX_TEST_TANSU=$tansu"
            return 0
        fi
        if ! flock -n "$lock" true; then
            log "waiting for the tansu build in the background (log: $build_log)"
            flock "$lock" true
        fi
        if ! tansu_built "$tansu"; then
            log "building tansu $TANSU_VERSION into $TOOLS_DIR (once per machine, several minutes)"
            flock "$lock" "${build[@]}" >&2
        fi
        rm -rf "$TOOLS_DIR/tansu-target"
    fi
    if ! kafka_up; then
        log "starting tansu on 127.0.0.1:9092 (in memory)"
        mkdir -p "$TOOLS_DIR/run"
        # setsid -f: the broker runs on in its own session, holding none of our pipes.
        (cd "$TOOLS_DIR/run" && exec setsid -f "$tansu" broker \
            --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
            --storage-engine memory://tansu/ >"$TOOLS_DIR/run/tansu-9092.log" 2>&1 </dev/null)
        wait_for "tansu (Kafka on 9092)" 30 kafka_up
    fi
    echo "OUTBOX_TEST_KAFKA_BROKERS=127.0.0.1:9092"
    echo "OUTBOX_TEST_TANSU=$tansu"
}

# moto (PyPI) emulates SQS in memory: what it holds is lost when it stops. Installed once per
# machine into a virtualenv of the project's.
MOTO_VERSION=5.2.5

sqs_up() { (exec 3<>/dev/tcp/127.0.0.1/4566) 2>/dev/null; }

ensure_sqs() {
    local venv=$TOOLS_DIR/moto-venv
    if ! "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" >/dev/null 2>&1; then
        python3 -m venv --clear "$venv"
        log "installing moto $MOTO_VERSION into $venv"
        "$venv/bin/pip" install -q --disable-pip-version-check "moto[server]==$MOTO_VERSION"
    fi
    if ! sqs_up; then
        log "starting moto_server (SQS) on 127.0.0.1:4566 (in memory)"
        mkdir -p "$TOOLS_DIR/run"
        (cd "$TOOLS_DIR/run" && exec setsid -f "$venv/bin/moto_server" -H 127.0.0.1 -p 4566 \
            >"$TOOLS_DIR/run/moto-4566.log" 2>&1 </dev/null)
        wait_for "moto_server (SQS on 4566)" 30 sqs_up
    fi
    # The queues the examples use; CreateQueue answers with the existing queue when it is there.
    for queue in outbox-test outbox-test.fifo; do
        local attributes=
        [[ $queue == *.fifo ]] && attributes=',"Attributes":{"FifoQueue":"true"}'
        curl -fsS -o /dev/null -X POST http://127.0.0.1:4566/ \
            -H 'Content-Type: application/x-amz-json-1.0' -H 'X-Amz-Target: AmazonSQS.CreateQueue' \
            -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0' \
            -d "{\"QueueName\":\"$queue\"$attributes}"
    done
    echo "OUTBOX_TEST_SQS_ENDPOINT=http://127.0.0.1:4566"
    echo "OUTBOX_TEST_MOTO=$venv/bin/moto_server"
}

# The foreign-writer tests (outbox-cli/tests/writers.rs) run services written in Python
# (psycopg, PyMySQL) and Node (pg) against the outbox. Their packages live in a
# virtualenv and a node_modules directory owned by the project, outside the repository.
WRITERS_DIR=${OUTBOX_WRITERS_DIR:-$HOME/.cache/outbox-writers}
BROWSER_DIR=${OUTBOX_BROWSER_DIR:-$HOME/.cache/outbox-browser}

ensure_writers() {
    local venv=$WRITERS_DIR/venv
    if ! "$venv/bin/python" -c 'import psycopg, pymysql' >/dev/null 2>&1; then
        python3 -m venv --clear "$venv"
        log "installing psycopg and PyMySQL into $venv"
        "$venv/bin/pip" install -q --disable-pip-version-check 'psycopg[binary]>=3.1,<4' 'PyMySQL>=1.1'
    fi
    echo "OUTBOX_TEST_PYTHON=$venv/bin/python"
    if [[ ! -f $WRITERS_DIR/node/node_modules/pg/package.json ]]; then
        log "installing the pg package into $WRITERS_DIR/node"
        npm install --prefix "$WRITERS_DIR/node" --silent --no-audit --no-fund 'pg@^8' >/dev/null
    fi
    echo "OUTBOX_TEST_NODE=$(command -v node)"
    echo "OUTBOX_TEST_NODE_PATH=$WRITERS_DIR/node/node_modules"
}

# Debian's Chromium and playwright-core (npm) for the dashboard's browser test; Playwright
# never downloads a browser of its own here.
ensure_browser() {
    if [[ ! -f $BROWSER_DIR/node_modules/playwright-core/package.json ]]; then
        log "installing playwright-core into $BROWSER_DIR"
        npm install --prefix "$BROWSER_DIR" --silent --no-audit --no-fund 'playwright-core@^1.49' >/dev/null
    fi
    echo "OUTBOX_TEST_CHROMIUM=/usr/bin/chromium"
    echo "OUTBOX_TEST_PLAYWRIGHT_PATH=$BROWSER_DIR/node_modules"
}

ensure_packages
ensure_postgres
ensure_mariadb
ensure_redis
ensure_rabbitmq
ensure_nats
ensure_mqtt
ensure_kafka
ensure_sqs
ensure_writers
ensure_browser
