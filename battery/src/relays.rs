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
        }
    }
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
        let child = ChildGuard::spawn(
            format!("relay {slot}"),
            Command::new(&self.command.program)
                .args(&self.command.args)
                .env_remove("OUTBOX_CONFIG")
                .env("RUST_LOG", "error")
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ACCESS_KEY_ID", "battery")
                .env("AWS_SECRET_ACCESS_KEY", "battery"),
        );
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
