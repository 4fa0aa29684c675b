//! Sinks and relays built from configuration.

use std::sync::Arc;

use outbox_core::{DynSink, Relay, RelayBuilder, Store};

use crate::{Config, Error};

/// The sink for one route, chosen by the `url` scheme in its settings: `http://` and
/// `https://` (feature `http`), `redis://` and `rediss://` (feature `redis`).
///
/// # Errors
///
/// [`Error::FeatureDisabled`] naming the feature to enable, [`Error::UnsupportedScheme`],
/// or [`Error::Sink`] with the sink's own reason.
pub async fn build_sink(route: &str, settings: &toml::Table) -> Result<Arc<dyn DynSink>, Error> {
    let url = settings
        .get("url")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| Error::Config(format!("routes.{route}: missing `url`")))?;
    let scheme = url.split("://").next().unwrap_or("");
    let sink_error = |reason: String| Error::Sink {
        route: route.to_owned(),
        reason,
    };
    let _ = &sink_error;
    match scheme {
        "http" | "https" => {
            #[cfg(feature = "http")]
            return crate::routes::http_sink(route, settings).map_err(sink_error);
            #[cfg(not(feature = "http"))]
            return Err(Error::FeatureDisabled {
                what: "sink",
                scheme: "http",
                feature: "http",
            });
        }
        "redis" | "rediss" => {
            #[cfg(feature = "redis")]
            return crate::routes::redis_sink(route, settings)
                .await
                .map_err(sink_error);
            #[cfg(not(feature = "redis"))]
            return Err(Error::FeatureDisabled {
                what: "sink",
                scheme: "redis",
                feature: "redis",
            });
        }
        _ => Err(Error::UnsupportedScheme {
            what: "sink",
            url: crate::config::redact_url(url),
            known: "http://, https://, redis://, rediss://",
        }),
    }
}

/// A relay over `store` with every route of `config`, ready to `run`.
///
/// # Errors
///
/// Any route's sink error, or invalid relay settings.
pub async fn build_relay<S: Store>(config: &Config, store: S) -> Result<Relay<S>, Error> {
    build_relay_with(config, store, |builder| builder).await
}

/// Like [`build_relay`], letting `customize` add what a file cannot hold (a wakeup, a
/// clock, routes built in code) before the relay is built.
///
/// # Errors
///
/// Any route's sink error, or invalid relay settings.
pub async fn build_relay_with<S: Store>(
    config: &Config,
    store: S,
    customize: impl FnOnce(RelayBuilder<S>) -> RelayBuilder<S>,
) -> Result<Relay<S>, Error> {
    let relay = &config.relay;
    let mut builder = Relay::builder(store)
        .batch_size(relay.batch_size)
        .concurrency(relay.concurrency)
        .lease(relay.lease)
        .poll_interval(relay.poll_interval)
        .shutdown_grace(relay.shutdown_grace)
        .dead_letter_unrouted(relay.dead_letter_unrouted)
        .ordering(relay.ordering())
        .retry(config.retry.policy());
    if let Some(owner) = &relay.owner {
        builder = builder.owner(owner.clone());
    }
    if let Some(timeout) = relay.publish_timeout {
        builder = builder.publish_timeout(timeout);
    }
    for (route, settings) in &config.routes {
        builder = builder.route_dyn(route.clone(), build_sink(route, settings).await?);
    }
    Ok(customize(builder).build()?)
}

#[cfg(feature = "http")]
fn http_sink(route: &str, settings: &toml::Table) -> Result<Arc<dyn DynSink>, String> {
    let endpoint: outbox_sink_http::EndpointConfig = toml::Value::Table(settings.clone())
        .try_into()
        .map_err(|e: toml::de::Error| one_line(&e.to_string()))?;
    // The caller names the route; the sink's own message would name it a second time.
    let sink = outbox_sink_http::HttpSinkConfig::new()
        .route(route, endpoint)
        .build()
        .map_err(|e| format!("invalid {}: {}", e.setting(), e.reason()))?;
    Ok(Arc::new(sink))
}

#[cfg(feature = "redis")]
async fn redis_sink(_route: &str, settings: &toml::Table) -> Result<Arc<dyn DynSink>, String> {
    let config: outbox_sink_redis::RedisSinkConfig = toml::Value::Table(settings.clone())
        .try_into()
        .map_err(|e: toml::de::Error| one_line(&e.to_string()))?;
    let sink = outbox_sink_redis::RedisSink::connect(config)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(sink))
}

#[cfg(any(feature = "http", feature = "redis"))]
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}
