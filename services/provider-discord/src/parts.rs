//! The plan of a streamed answer shown as several messages: the text split at Discord's
//! 2000 characters, each part created once and then edited in place, at most once per
//! interval. Pure: the caller keeps the state where every pod sees it and makes the calls
//! the plan names.
//!
//! This stays Discord's own rather than the kit's `DeltaStream`, which shows an answer as
//! one message: a Discord answer past 2000 characters streams into several messages (each
//! created with its own enforced nonce, so a repeat creates none twice) while typing is
//! renewed, and the final message edits every part.

/// One call the caller makes to bring what is shown to `parts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Edit the `index`th message shown to this text.
    Edit { index: usize, text: String },
    /// Create the `index`th message with this text.
    Create { index: usize, text: String },
}

/// Splits `text` into parts of at most `max` characters, preferring a line break in the
/// second half of a part; blank parts are dropped.
pub(crate) fn split(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.chars().count() > max {
        let cut = rest
            .char_indices()
            .nth(max)
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        let at = rest[..cut]
            .rfind('\n')
            .filter(|&i| i >= cut / 2)
            .map(|i| i + 1)
            .unwrap_or(cut);
        out.push(rest[..at].to_owned());
        rest = &rest[at..];
    }
    out.push(rest.to_owned());
    out.retain(|p| !p.trim().is_empty());
    out
}

/// The steps from what is shown (a fingerprint per message, in order) to `parts`: changed
/// messages are edited, missing ones created, unchanged ones left alone.
pub(crate) fn plan(
    shown: &[String],
    parts: &[String],
    fingerprint: impl Fn(&str) -> String,
) -> Vec<Step> {
    parts
        .iter()
        .enumerate()
        .filter_map(|(index, text)| match shown.get(index) {
            Some(fp) if *fp == fingerprint(text) => None,
            Some(_) => Some(Step::Edit {
                index,
                text: text.clone(),
            }),
            None => Some(Step::Create {
                index,
                text: text.clone(),
            }),
        })
        .collect()
}

/// Whether an edit may go now: the last change is at least `interval_ms` old. The final
/// message is not bound by it (it waits out the rest instead).
pub(crate) fn edit_due(last_ms: i64, now_ms: i64, interval_ms: i64) -> bool {
    now_ms - last_ms >= interval_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(s: &str) -> String {
        format!("#{}", s.len())
    }

    #[test]
    fn splits_at_the_limit_preferring_lines() {
        assert_eq!(split("abc", 5), ["abc"]);
        assert_eq!(split("abcdefgh", 3), ["abc", "def", "gh"]);
        assert_eq!(split("ab\ncdef", 5), ["ab\n", "cdef"]);
        assert_eq!(split("é".repeat(4).as_str(), 2), ["éé", "éé"]);
        assert!(split("   ", 2).is_empty());
        let long = "x".repeat(4500);
        let parts = split(&long, 2000);
        assert_eq!(
            parts.iter().map(|p| p.chars().count()).collect::<Vec<_>>(),
            [2000, 2000, 500]
        );
    }

    #[test]
    fn plans_edits_of_changed_parts_and_creates_new_ones() {
        let parts = vec!["aa".to_owned(), "bbb".to_owned()];
        assert_eq!(
            plan(&[], &parts, fp),
            [
                Step::Create {
                    index: 0,
                    text: "aa".into()
                },
                Step::Create {
                    index: 1,
                    text: "bbb".into()
                }
            ]
        );
        assert_eq!(
            plan(&["#2".into()], &parts, fp),
            [Step::Create {
                index: 1,
                text: "bbb".into()
            }]
        );
        assert_eq!(
            plan(&["#1".into(), "#3".into()], &parts, fp),
            [Step::Edit {
                index: 0,
                text: "aa".into()
            }]
        );
        assert!(edit_due(0, 1000, 1000));
        assert!(!edit_due(500, 1000, 1000));
    }
}
