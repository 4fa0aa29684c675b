//! The faults, each injected `cycles` times while the writers commit.

use std::process::{Command, Stdio};
use std::time::Duration;

use clap::ValueEnum;
use outbox_battery::consumers::{Behaviour, Receiver, RedisServer};
use outbox_test_support::wait_until;

use crate::ledger::Ledger;
use crate::relays::Relays;
use crate::{Database, SinkKind};
use outbox_test_support::proxy::{Net, Proxy};

/// A fault scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Fault {
    /// No fault: the writers and one relay run for `cycles` seconds.
    None,
    /// One relay, killed with SIGKILL while it holds leases, restarted, `cycles` times.
    Kill9,
    /// Three relays; one of them, picked at random, killed with SIGKILL at a random moment
    /// and restarted, `cycles` times.
    Kill3,
    /// Two relays; one of them frozen with SIGSTOP while it holds leases, for longer than
    /// the lease, then resumed (SIGCONT): its lease expired while its sends were in flight.
    Sigstop,
    /// The database restarted under the relays, alternately fast (PostgreSQL `-m fast`,
    /// MariaDB shutdown) and immediate (`-m immediate`, SIGKILL to mariadbd).
    DbRestart,
    /// The relays' database connections ended by the server (`pg_terminate_backend`,
    /// `KILL CONNECTION`) every 0.5–1.5 s.
    DbKill,
    /// A TCP fault proxy between the relays and the sink's server (the webhook receiver,
    /// Redis, RabbitMQ, the SQS emulator), cycling through lost replies (the request took
    /// effect, the reply is dropped and the connection reset), 300 ms of latency per
    /// chunk, and a partition that heals; 2 s each, with 2 s of calm between.
    NetSink,
    /// The same proxy between the relays and the database.
    NetStore,
    /// The proxy between the relays and the sink's server silences the connections that
    /// carry data for 2 s, for good (no reset, no FIN), then lets new connections through.
    SilentSink,
    /// The same between the relays and the database.
    SilentStore,
    /// Two relays whose wall clocks are off, one 10 minutes ahead and one 10 minutes
    /// behind (libfaketime); each cycle one of them, in turn, is killed while it holds
    /// leases and restarted. Leases, due times and commit order must follow the
    /// database's clock: a relay that judged them by its own would take rows another
    /// still holds, or wait 10 minutes for due rows.
    ClockSkew,
    /// The sink's server stopped and started again after 1 s: the webhook receiver (its
    /// listener and open connections dropped, as in a crash), a private Redis with an
    /// fsynced AOF (SIGKILL and SIGTERM alternately), RabbitMQ (`stop_app`,
    /// `start_app`). Consumers reconnect and read on.
    SinkRestart,
    /// The webhook receiver answers 503 for 2 s out of every 3 (HTTP only).
    #[value(name = "receiver-5xx")]
    Receiver5xx,
    /// The webhook receiver takes 3 s to answer, longer than the route's 1 s request
    /// timeout, for 2 s out of every 3 (HTTP only): messages arrive whose sender saw a
    /// timeout.
    ReceiverSlow,
}

impl Fault {
    /// How many relays run during the scenario.
    pub(crate) fn relays(self) -> usize {
        match self {
            Self::Kill3 => 3,
            Self::Sigstop | Self::ClockSkew => 2,
            _ => 1,
        }
    }

    /// Whether the scenario kills relays, so that re-sends are bounded by the rows they
    /// held leased when they died.
    pub(crate) fn kills(self) -> bool {
        matches!(self, Self::Kill9 | Self::Kill3 | Self::ClockSkew)
    }

    /// Why the scenario cannot run on `store` and `sink`, if it cannot.
    pub(crate) fn unsupported(self, database: Database, sink: SinkKind) -> Option<&'static str> {
        match self {
            Self::DbRestart | Self::DbKill if database == Database::Sqlite => {
                Some("SQLite is a file: there is no server to restart or connection to end")
            }
            Self::Receiver5xx | Self::ReceiverSlow if sink != SinkKind::Http => {
                Some("the receiver faults need the HTTP sink's receiver")
            }
            Self::SinkRestart if sink == SinkKind::Sqs => Some(
                "moto, the SQS emulator, keeps its queues in memory: a restart empties them, \
                 which SQS itself never does",
            ),
            Self::SinkRestart if sink == SinkKind::Kafka => Some(
                "tansu, the Kafka-protocol broker here, can lose an idempotent producer's state \
                 when killed and then fail that producer for good; sink-kafka's broker_restart \
                 test covers the restart with that worked around",
            ),
            Self::NetSink | Self::SilentSink if sink == SinkKind::Kafka => {
                Some("Kafka clients connect to the addresses the broker advertises, around a proxy")
            }
            Self::ClockSkew if database == Database::Sqlite => Some(
                "SQLite has no clock of its own: each process computes the table's times with \
                 its own clock, and processes that share a SQLite file share a host and its clock",
            ),
            Self::NetStore | Self::SilentStore if database == Database::Sqlite => {
                Some("SQLite is a file: there is no connection to put a proxy on")
            }
            _ => None,
        }
    }
}

/// What was injected.
#[derive(Debug, Default)]
pub(crate) struct Injected {
    /// Faults injected (for `db-kill`, the rounds that ended at least one connection).
    pub(crate) faults: usize,
    /// Rows the killed relays held leased when they died, summed over the kills.
    pub(crate) leased_at_kills: i64,
}

/// What a fault acts on.
pub(crate) struct Target<'a> {
    pub(crate) database: Database,
    pub(crate) ledger: &'a Ledger,
    pub(crate) relays: &'a mut Relays,
    pub(crate) receiver: Option<&'a Receiver>,
    pub(crate) sink: Option<&'a SinkServer>,
    pub(crate) proxy: Option<&'a Proxy>,
    pub(crate) lease: Duration,
    /// The relays are the broken relay. It marks a batch before sending it, so what it
    /// loses, it no longer holds leased: each of its kills counts, leases found or not.
    pub(crate) broken: bool,
}

/// A limit for waits on a relay to take leases: generous, since a database restart or a
/// slow machine can hold it up.
const LEASE_WAIT: Duration = Duration::from_secs(60);

/// How many kills [`Target::kill_mid_batch`] tries before it gives up on landing one
/// mid-batch.
const KILL_TRIES: usize = 20;

impl Target<'_> {
    /// Injects `fault` `cycles` times.
    pub(crate) async fn inject(&mut self, fault: Fault, cycles: usize) -> Injected {
        // A relay that cannot reach its store or sink at start exits (a supervisor restarts
        // it): faults begin once the relays publish.
        wait_until("the relays to publish", LEASE_WAIT, || async {
            self.ledger
                .statuses()
                .await
                .is_some_and(|(_, published, _)| published > 0)
        })
        .await;
        let mut injected = Injected::default();
        for cycle in 0..cycles {
            match fault {
                Fault::None => tokio::time::sleep(Duration::from_secs(1)).await,
                Fault::Kill9 => injected.leased_at_kills += self.kill_mid_batch(0).await,
                Fault::Kill3 => {
                    pause(200..1_000).await;
                    let slot = fastrand::usize(..self.relays.len());
                    injected.leased_at_kills += self.kill(slot).await;
                }
                Fault::ClockSkew => {
                    injected.leased_at_kills += self.kill_mid_batch(cycle % 2).await;
                }
                Fault::Sigstop => {
                    self.holding_leases(0).await;
                    self.relays.signal(0, true);
                    tokio::time::sleep(self.lease + Duration::from_secs(1)).await;
                    self.relays.signal(0, false);
                    pause(500..1_000).await;
                }
                Fault::DbRestart => {
                    pause(500..1_500).await;
                    let database = self.database;
                    tokio::task::block_in_place(|| restart_database(database, cycle % 2 == 1));
                }
                Fault::DbKill => {
                    pause(500..1_500).await;
                    if self.ledger.kill_connections().await == 0 {
                        continue; // nothing was connected: no fault to count
                    }
                }
                Fault::NetSink | Fault::NetStore | Fault::SilentSink | Fault::SilentStore => {
                    let proxy = self.proxy.expect("a proxy");
                    proxy.set(match fault {
                        Fault::SilentSink | Fault::SilentStore => Net::Silence,
                        _ => [Net::LoseReplies, Net::Slow, Net::Partition][cycle % 3],
                    });
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    proxy.set(Net::Pass);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Fault::SinkRestart => {
                    pause(500..1_500).await;
                    let server = self.sink.expect("a sink server the battery can restart");
                    server.restart(cycle % 2 == 1).await;
                }
                Fault::Receiver5xx | Fault::ReceiverSlow => {
                    let receiver = self.receiver.expect("an HTTP receiver");
                    receiver.behave(if fault == Fault::Receiver5xx {
                        Behaviour::Unavailable
                    } else {
                        Behaviour::Slow
                    });
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    receiver.behave(Behaviour::Accept);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            injected.faults += 1;
            if let Some(exit) = self.relays.exited() {
                panic!("{exit} during the {fault:?} scenario");
            }
        }
        injected
    }

    /// Waits until the relay in `slot` holds leased rows: a kill or stop then lands
    /// mid-batch.
    async fn holding_leases(&self, slot: usize) {
        let pid = self.relays.pid(slot);
        wait_until(
            &format!("relay {slot} (pid {pid}) to hold leased rows"),
            LEASE_WAIT,
            || async { self.ledger.leased_by(pid).await > 0 },
        )
        .await;
    }

    /// Kills the relay in `slot` while it holds leased rows, at a random point of its
    /// batch; returns the rows it held. A kill that lands between batches (the relay
    /// finished its batch during the random pause) does not count: the next try kills
    /// the new relay as soon as it is seen holding leases. The broken relay's kills all
    /// count (see [`Target::broken`]).
    async fn kill_mid_batch(&mut self, slot: usize) -> i64 {
        let mut delay = 0..300;
        for _ in 0..KILL_TRIES {
            self.holding_leases(slot).await;
            pause(delay).await;
            let leased = self.kill(slot).await;
            if leased > 0 || self.broken {
                return leased;
            }
            delay = 0..1;
        }
        panic!("{KILL_TRIES} kills of relay {slot} in a row found it holding no leased rows");
    }

    /// SIGKILL to the relay in `slot`, then a new one in its place; returns the rows the
    /// killed relay held leased.
    async fn kill(&mut self, slot: usize) -> i64 {
        let pid = self.relays.kill(slot);
        let leased = self.ledger.leased_by(pid).await;
        self.relays.restart(slot);
        leased
    }
}

/// Sleeps a random number of milliseconds in `range`.
async fn pause(range: std::ops::Range<u64>) {
    tokio::time::sleep(Duration::from_millis(fastrand::u64(range))).await;
}

/// A sink's server the `sink-restart` fault restarts.
pub(crate) enum SinkServer {
    /// The webhook receiver.
    Receiver(Receiver),
    /// The battery's own Redis.
    Redis(RedisServer),
    /// The shared RabbitMQ (its app stopped and started; the node stays up).
    RabbitMq,
    /// The battery's own NATS server (killed, and started again on its JetStream store).
    Nats(std::sync::Mutex<outbox_test_support::servers::PrivateServer>),
    /// The battery's own mosquitto (persistence on), stopped cleanly and started again:
    /// mosquitto writes what it holds on a clean stop, and a SIGKILL loses what it
    /// acknowledged since its last autosave, which is the broker's durability, not the
    /// relay's.
    Mqtt(std::sync::Mutex<outbox_test_support::servers::PrivateServer>),
}

impl SinkServer {
    /// Stops the server and starts it again after 1 s; `crash` picks the rougher stop
    /// where there is a choice (Redis: SIGKILL rather than SIGTERM).
    async fn restart(&self, crash: bool) {
        let down = Duration::from_secs(1);
        match self {
            Self::Receiver(receiver) => receiver.restart(down).await,
            Self::Redis(redis) => redis.restart(down, crash).await,
            Self::RabbitMq => {
                let rabbitmqctl = |args: &[&str]| {
                    tokio::task::block_in_place(|| {
                        run("a RabbitMQ restart", Command::new("rabbitmqctl").args(args));
                    });
                };
                rabbitmqctl(&["stop_app"]);
                tokio::time::sleep(down).await;
                rabbitmqctl(&["start_app"]);
                rabbitmqctl(&["await_startup"]);
            }
            Self::Nats(server) => {
                let lock = || server.lock().unwrap_or_else(|e| e.into_inner());
                lock().kill();
                tokio::time::sleep(down).await;
                tokio::task::block_in_place(|| lock().restart());
            }
            Self::Mqtt(server) => {
                let lock = || server.lock().unwrap_or_else(|e| e.into_inner());
                tokio::task::block_in_place(|| lock().stop());
                tokio::time::sleep(down).await;
                tokio::task::block_in_place(|| lock().restart());
            }
        }
    }
}

/// Restarts the `database` server: fast (a clean shutdown) or `immediate` (as a
/// crash: PostgreSQL `-m immediate`, SIGKILL to mariadbd).
fn restart_database(database: Database, immediate: bool) {
    let run = |command: &mut Command| run("a database restart", command);
    match database {
        Database::Postgres => {
            let version = std::fs::read_dir("/etc/postgresql")
                .expect("PostgreSQL's clusters under /etc/postgresql")
                .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .max_by_key(|v| v.parse::<u32>().unwrap_or(0))
                .expect("a PostgreSQL cluster");
            let mode = if immediate { "immediate" } else { "fast" };
            run(Command::new("pg_ctlcluster").args([
                "--skip-systemctl-redirect",
                &version,
                "main",
                "restart",
                "-m",
                mode,
            ]));
        }
        Database::Mysql => {
            if immediate {
                run(Command::new("pkill").args(["-KILL", "-x", "mariadbd"]));
            } else {
                run(Command::new("mariadb-admin").args([
                    "-h",
                    "127.0.0.1",
                    "-u",
                    "root",
                    "shutdown",
                ]));
            }
            // mariadbd leaves when its shutdown ends; start the next one after that.
            for _ in 0..100 {
                if !Command::new("pgrep")
                    .args(["-x", "mariadbd"])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            run(Command::new("start-stop-daemon").args([
                "--start",
                "--oknodo",
                "--background",
                "--exec",
                "/usr/sbin/mariadbd",
                "--",
                "--user=mysql",
            ]));
        }
        Database::Sqlite => unreachable!("checked by Fault::unsupported"),
    }
}

/// Runs `command`, for `what`, to completion; panics if it fails.
fn run(what: &str, command: &mut Command) {
    let output = outbox_test_support::output_within(what, Duration::from_secs(60), command);
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
