//! What the fuzz targets share: cutting one input into several fields, and the passwords
//! an input holds that no output may repeat.

/// `data` as text, cut into at most `n` fields at NUL bytes (the last takes the rest).
pub fn fields(data: &[u8], n: usize) -> Vec<String> {
    String::from_utf8_lossy(data)
        .splitn(n, '\0')
        .map(str::to_owned)
        .collect()
}

/// The password of `url` read as a URL, if it can be told apart from the rest of an
/// output and `whole` (the input it came from) holds it once: an output that shows it
/// repeated it. Told apart means at least 6 bytes, with a letter and a digit, so that
/// it is no word an output holds anyway (a field named `secrets`, a setting `3600s`).
pub fn password(url: &str, whole: &str) -> Option<String> {
    let parsed = url::Url::parse(url).ok()?;
    let password = parsed.password()?;
    let distinct = password.len() >= 6
        && password.bytes().any(|b| b.is_ascii_digit())
        && password.bytes().any(|b| b.is_ascii_alphabetic());
    // Nor may the rest of the URL, as a parser writes it back, hold it: `%12http2` holds
    // `2http2` once `\x12` is percent-encoded.
    let mut rest = parsed.clone();
    let _ = rest.set_password(None);
    let elsewhere = rest.as_str().contains(password);
    (distinct && !elsewhere && whole.matches(password).count() == 1).then(|| password.to_owned())
}

/// The path segments and query values of `url` read as a URL that can be told apart (as
/// [`password`] tells a password): what no error about the URL may show.
pub fn path_and_query_values(url: &str, whole: &str) -> Vec<String> {
    let Ok(parsed) = url::Url::parse(url) else {
        return Vec::new();
    };
    let distinct = |text: &str| {
        text.len() >= 6
            && text.bytes().any(|b| b.is_ascii_digit())
            && text.bytes().any(|b| b.is_ascii_alphabetic())
            && whole.matches(text).count() == 1
    };
    let segments = parsed.path().split('/').map(str::to_owned);
    let values = parsed.query_pairs().map(|(_, v)| v.into_owned());
    // Taken as the URL writes them (decoded values may differ from the input's text).
    let raw_values = parsed
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('=').map(|(_, v)| v.to_owned()));
    let mut found: Vec<String> = segments.chain(values).chain(raw_values).filter(|t| distinct(t)).collect();
    found.sort();
    found.dedup();
    found
}

/// The passwords of the URLs that are string values in `toml` (`key = "scheme://…"`), as
/// [`password`] finds them in `whole`.
pub fn passwords_in_values(toml: &str, whole: &str) -> Vec<String> {
    toml.lines()
        .filter_map(|line| {
            let (_, value) = line.split_once('=')?;
            let value = value.trim_start().strip_prefix('"')?;
            password(value.split('"').next()?, whole)
        })
        .collect()
}

/// Panics if `output` repeats one of `secrets`; `what` names the output.
pub fn assert_hidden(secrets: &[String], output: &str, what: &str) {
    for secret in secrets {
        assert!(
            !output.contains(secret.as_str()),
            "{what} repeats a password of the input: {output}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_passwords_of_urls_in_values() {
        let text = "url = \"postgres://app:hunter22@db/app\"\nx=\"redis://:s3cret!!@r:6379\"";
        assert_eq!(passwords_in_values(text, text), ["hunter22", "s3cret!!"]);
        let short = "amqp://u:sh0rt@h";
        assert_eq!(password(short, short), None, "too short to tell");
        let word = "amqp://u:secret@h";
        assert_eq!(password(word, word), None, "a word outputs hold anyway");
        let encoded = "amqp://u:2http2@h/\x12http2";
        assert_eq!(password(encoded, encoded), None, "in the path once encoded");
        let twice = "amqp://u:repeated@h/repeated";
        assert_eq!(password(twice, twice), None, "held twice");
    }
}
