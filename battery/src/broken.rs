//! The deliberately broken relay: the real relay and sinks from the same config, each sink
//! wrapped so that it reports every message published *before* sending it. Killed between
//! the two, it has marked messages that never left: the battery must count them lost.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use outbox::{
    Config, DynSink, Failure, Message, Outbox, Outcome, Outcomes, PublishContext, Registry, Sink,
};

/// Reports every message published, waits a little (so that the mark is written), then
/// sends the batch through the real sink.
struct MarkFirst(Arc<dyn DynSink>);

impl Sink for MarkFirst {
    /// Sends, then says every message was published (the relay calls
    /// `publish_reporting`, which says so first).
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = self.0.publish(batch, cx).await;
        Ok(vec![Outcome::published(); batch.len()])
    }

    async fn publish_reporting(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        outcomes.report_all(batch.len(), Ok(vec![Outcome::published(); batch.len()]));
        let _ = self.publish(batch, cx).await;
    }
}

/// Runs the broken relay over the config at `path` until SIGTERM.
pub(crate) async fn relay(path: &Path) -> ExitCode {
    match run(path).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("broken relay: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(path: &Path) -> Result<(), outbox::Error> {
    let config = Config::load(path)?;
    let registry = Registry::default();
    let store = registry.connect_store(&config.store).await?;
    let mut builder = Outbox::builder_any(store)
        .wakeups(config.relay.wakeups.unwrap_or(true))
        .relay(|relay| relay.settings(&config.relay).retry(config.retry.policy()));
    for (route, table) in &config.routes {
        let sink = registry.build_sink(route, table).await?;
        builder = builder.route(route.clone(), MarkFirst(sink));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    builder
        .build()
        .await?
        .run(async move {
            term.recv().await;
        })
        .await;
    Ok(())
}
