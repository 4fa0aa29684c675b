//! A configuration file and `OUTBOX_…` variables, as the CLI and `Config::load` read them:
//! parsing, each route's policy and sink settings, the health objective and the store's
//! schema. Nothing may panic, and no error may repeat the password of a URL given as a
//! value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_fuzz::{assert_hidden, fields, password, passwords_in_values};

fuzz_target!(|data: &[u8]| {
    // The file, then up to four `NAME=value` variables.
    let parts = fields(data, 5);
    let env: Vec<(String, String)> = parts[1..]
        .iter()
        .filter_map(|v| v.split_once('='))
        .map(|(k, v)| (format!("OUTBOX_{k}"), v.to_owned()))
        .collect();
    // The passwords of URLs given as values, in the file or in a variable.
    let whole = parts.join("\n");
    let mut secrets = passwords_in_values(&parts[0], &whole);
    secrets.extend(env.iter().filter_map(|(_, v)| password(v, &whole)));
    match outbox::Config::from_toml(&parts[0], env) {
        Err(error) => assert_hidden(&secrets, &error.to_string(), "a config error"),
        Ok(config) => {
            assert_hidden(&secrets, &format!("{config:?}"), "the config's Debug");
            for (name, route) in &config.routes {
                if let Err(error) = route.policy(name) {
                    assert_hidden(&secrets, &error.to_string(), "a route policy error");
                }
                let _ = route.sink_settings(name);
            }
            let _ = config.health.objective();
            if let Err(error) = outbox::Registry::default().store_schema(&config.store) {
                assert_hidden(&secrets, &error.to_string(), "a store schema error");
            }
        }
    }
});
