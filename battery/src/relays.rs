//! Relays as separate processes, each owned by a [`ChildGuard`] (killed if the battery
//! panics), with the signals the faults send them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use outbox_test_support::ChildGuard;

/// How a relay process is started.
#[derive(Debug, Clone)]
pub(crate) struct RelayCommand {
    program: PathBuf,
    args: Vec<String>,
    /// Skewed wall clocks, once `clocks_off_by` set them.
    skew: Option<Skew>,
}

/// How the relays' wall clocks are skewed.
#[derive(Debug, Clone)]
struct Skew {
    /// The libraries that skew them (`LD_PRELOAD`): the shim, then libfaketime.
    preload: String,
    /// Per slot, how far the relay's wall clock is off (libfaketime's `FAKETIME`).
    offsets: Vec<&'static str>,
}

impl RelayCommand {
    /// `outbox --config <config> relay`: the product's relay.
    pub(crate) fn cli(outbox: &Path, config: &Path) -> Self {
        Self {
            program: outbox.to_owned(),
            args: vec![
                "--config".into(),
                config.display().to_string(),
                "relay".into(),
            ],
            skew: None,
        }
    }

    /// This binary's deliberately broken relay (`outbox-battery broken-relay`), which
    /// reports every message published before it sends it.
    pub(crate) fn broken(config: &Path) -> Self {
        Self {
            program: std::env::current_exe().expect("the battery's own path"),
            args: vec![
                "broken-relay".into(),
                "--config".into(),
                config.display().to_string(),
            ],
            skew: None,
        }
    }

    /// Runs the relay in slot `i` with its wall clock off by `offsets[i]` (`+10m`,
    /// `-10m`) through libfaketime; the monotonic clock, which times leases and waits
    /// inside the relay, is left alone. `scratch` receives the small library that
    /// completes libfaketime (`battery/shim/cnd_timedwait.c`, built with `cc`).
    ///
    /// # Panics
    ///
    /// If the shim does not build, or libfaketime does not change the wall clock of a
    /// child process here.
    pub(crate) fn clocks_off_by(mut self, offsets: &[&'static str], scratch: &Path) -> Self {
        let preload = format!("{} {}", build_shim(scratch).display(), faketime_library());
        for offset in offsets {
            let mut date = Command::new("date");
            date.arg("+%s");
            skew(&mut date, &preload, offset);
            let output = date.output().expect("run date");
            let seen: i64 = String::from_utf8_lossy(&output.stdout)
                .trim()
                .parse()
                .expect("date +%s prints seconds");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs() as i64;
            assert!(
                (seen - now).abs() >= 60,
                "libfaketime ({}) left the clock of a child process alone under FAKETIME={offset}",
                faketime_library()
            );
        }
        self.skew = Some(Skew {
            preload,
            offsets: offsets.to_vec(),
        });
        self
    }
}

/// Where libfaketime is: `OUTBOX_TEST_FAKETIME`, or Debian's path (package `libfaketime`).
fn faketime_library() -> String {
    std::env::var("OUTBOX_TEST_FAKETIME")
        .unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1".into())
}

/// Builds `battery/shim/cnd_timedwait.c` into `scratch`; returns the library's path.
fn build_shim(scratch: &Path) -> PathBuf {
    let source = scratch.join("cnd_timedwait.c");
    let library = scratch.join("cnd_timedwait.so");
    std::fs::write(&source, include_str!("../shim/cnd_timedwait.c")).expect("write the shim");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .args([&library, &source])
        .arg("-ldl")
        .status()
        .expect("run cc (the clock-skew fault builds a small C library)");
    assert!(status.success(), "cc could not build {}", source.display());
    library
}

/// Has `command` run with `preload` (the shim and libfaketime) and its wall clock off by
/// `offset`.
fn skew(command: &mut Command, preload: &str, offset: &str) {
    command
        .env("LD_PRELOAD", preload)
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
}

/// The running relays, by slot.
pub(crate) struct Relays {
    command: RelayCommand,
    slots: Vec<Option<ChildGuard>>,
    /// Relay processes started so far (restarts included).
    pub(crate) started: usize,
}

impl Relays {
    /// Starts `count` relays.
    pub(crate) fn start(command: RelayCommand, count: usize) -> Self {
        let mut relays = Self {
            command,
            slots: (0..count).map(|_| None).collect(),
            started: 0,
        };
        for slot in 0..count {
            relays.restart(slot);
        }
        relays
    }

    /// How many slots there are.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The process id of the relay in `slot`.
    pub(crate) fn pid(&self, slot: usize) -> u32 {
        self.slots[slot].as_ref().expect("a running relay").id()
    }

    /// Starts a relay in `slot` (which must be empty or ended).
    pub(crate) fn restart(&mut self, slot: usize) {
        let mut command = Command::new(&self.command.program);
        command
            .args(&self.command.args)
            .env_remove("OUTBOX_CONFIG")
            // `OUTBOX_BATTERY_RELAY_LOG` (a `RUST_LOG` filter) to see a cell's relays at work.
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_BATTERY_RELAY_LOG").unwrap_or_else(|_| "error".into()),
            )
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "battery")
            .env("AWS_SECRET_ACCESS_KEY", "battery");
        if let Some(Skew { preload, offsets }) = &self.command.skew
            && let Some(offset) = offsets.get(slot)
        {
            skew(&mut command, preload, offset);
        }
        let child = ChildGuard::spawn(format!("relay {slot}"), &mut command);
        self.slots[slot] = Some(child);
        self.started += 1;
    }

    /// SIGKILL to the relay in `slot`, reaped; returns its process id.
    pub(crate) fn kill(&mut self, slot: usize) -> u32 {
        let mut child = self.slots[slot].take().expect("a running relay");
        let pid = child.id();
        child.kill();
        pid
    }

    /// SIGSTOP (`stop`) or SIGCONT to the relay in `slot`.
    pub(crate) fn signal(&self, slot: usize, stop: bool) {
        let signal = if stop { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &self.pid(slot).to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} relay {slot}");
    }

    /// Whether a relay exited by itself (it should not: it retries what fails).
    pub(crate) fn exited(&mut self) -> Option<String> {
        self.slots.iter_mut().enumerate().find_map(|(slot, child)| {
            let status = child.as_mut()?.try_wait()?;
            Some(format!("relay {slot} exited by itself ({status})"))
        })
    }

    /// SIGTERM to every relay, then waits up to 20 s for each to stop gracefully (it has a
    /// 10 s shutdown grace); returns how many had to be killed instead.
    pub(crate) fn stop_all(&mut self) -> usize {
        self.slots
            .iter_mut()
            .filter_map(Option::take)
            .map(|mut child| child.terminate(Duration::from_secs(20)).is_none())
            .filter(|&killed| killed)
            .count()
    }
}
