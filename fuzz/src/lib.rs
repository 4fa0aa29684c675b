//! What the fuzz targets share: cutting one input into several fields, and the secrets
//! an input holds that no output may repeat.

/// `data` as text, cut into at most `n` fields at NUL bytes (the last takes the rest).
pub fn fields(data: &[u8], n: usize) -> Vec<String> {
    String::from_utf8_lossy(data)
        .splitn(n, '\0')
        .map(str::to_owned)
        .collect()
}

/// The passwords of the URLs in `text` (each `scheme://…` up to a quote or white space)
/// that are long enough to be told apart and that `text` holds exactly once, so that
/// finding one in an output means the output repeated it.
pub fn passwords(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("://") {
        let start = text[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
            .map_or(0, |i| i + 1);
        let end = text[at..]
            .find(|c: char| c.is_whitespace() || "\"'".contains(c))
            .map_or(text.len(), |i| at + i);
        let Ok(url) = url::Url::parse(&text[start..end]) else {
            continue;
        };
        if let Some(password) = url.password()
            && password.len() >= 6
            && text.matches(password).count() == 1
        {
            found.push(password.to_owned());
        }
    }
    found
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
    fn finds_the_passwords_of_urls_in_text() {
        let text = "url = \"postgres://app:hunter22@db/app\"\nx = 'redis://:s3cret!!@r:6379'";
        assert_eq!(passwords(text), ["hunter22", "s3cret!!"]);
        assert!(passwords("amqp://u:short@h").is_empty(), "too short to tell");
        assert!(
            passwords("amqp://u:repeated@h/repeated").is_empty(),
            "held twice"
        );
    }
}
