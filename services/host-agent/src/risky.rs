//! `risky` patterns: which actions an agent must get a person's approval for.
//!
//! A pattern with `*` or `?` is a glob matched against the whole action (`*` any run of
//! characters, `?` one character); any other pattern matches when it occurs anywhere in the
//! action. Matching is case-sensitive.

/// The compiled `risky` list of one agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RiskyPatterns(Vec<Pattern>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Glob(Vec<char>),
    Substring(String),
}

impl RiskyPatterns {
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Self {
        Self(
            patterns
                .iter()
                .map(|p| {
                    let p = p.as_ref();
                    if p.contains(['*', '?']) {
                        Pattern::Glob(p.chars().collect())
                    } else {
                        Pattern::Substring(p.to_owned())
                    }
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when some pattern matches `action`.
    pub fn matches(&self, action: &str) -> bool {
        let text: Vec<char> = action.chars().collect();
        self.0.iter().any(|p| match p {
            Pattern::Substring(s) => action.contains(s.as_str()),
            Pattern::Glob(g) => glob_match(g, &text),
        })
    }
}

/// Iterative glob matching with single-star backtracking: linear in practice, never
/// exponential.
fn glob_match(pattern: &[char], text: &[char]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substrings() {
        let r = RiskyPatterns::new(&["rm -rf", "sudo "]);
        assert!(r.matches("rm -rf /tmp/build"));
        assert!(r.matches("cd / && sudo apt install x"));
        assert!(!r.matches("ls -la"));
        assert!(!r.matches("RM -RF /"), "case-sensitive");
        assert!(!RiskyPatterns::default().matches("rm -rf /"));
        assert!(RiskyPatterns::default().is_empty());
    }

    #[test]
    fn globs_match_the_whole_action() {
        let r = RiskyPatterns::new(&["git push*", "curl * | sh", "shutdown -? now"]);
        assert!(r.matches("git push"));
        assert!(r.matches("git push --force origin main"));
        assert!(!r.matches("echo git push"), "a glob is anchored");
        assert!(r.matches("curl https://x.example | sh"));
        assert!(!r.matches("curl https://x.example | sh -x"));
        assert!(r.matches("shutdown -h now"));
        assert!(!r.matches("shutdown -hh now"));
    }

    #[test]
    fn glob_edge_cases() {
        let m = |p: &str, t: &str| {
            glob_match(
                &p.chars().collect::<Vec<_>>(),
                &t.chars().collect::<Vec<_>>(),
            )
        };
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(m("a*b*c", "abcbc"));
        assert!(!m("a*b*c", "aXXbYY"));
        assert!(m("**x", "yyx"));
        assert!(!m("?", ""));
        assert!(m("é?", "éa"));
        // Pathological input stays fast.
        let long = "a".repeat(5000);
        assert!(!m("*a*a*a*a*a*b", &long));
    }
}
