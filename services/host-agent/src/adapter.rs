//! Adapters: how each runtime is started for one run.
//!
//! | runtime | argv | stdin |
//! |---|---|---|
//! | `exec` | `command` as configured | the goal, a newline, then open for approval answers |
//! | `hermes` | `hermes chat --quiet --query GOAL [--model M] [--toolsets T,..]` | closed |
//! | `openclaw` | `openclaw agent --local --session-id switchyard-RUN --message GOAL [--model M] [--timeout S]` | closed |
//!
//! For hermes and openclaw a configured `command` replaces the binary (a path or a launcher
//! such as `["uvx", "hermes-agent"]`); the flags are appended to it. Binaries are looked up on
//! `PATH` for every run, so installing one later needs no restart.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use switchyard_protocol::hosts::message::CreateRun;

use crate::config::{AgentConfig, Runtime};

/// How to start one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Write the goal and keep stdin open (the exec line protocol); else stdin is /dev/null.
    pub goal_on_stdin: bool,
    pub summary: SummaryMode,
}

/// What a successful run's `completion.summary` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryMode {
    /// The last progress line (exec: the final status line).
    LastLine,
    /// All plain output lines (hermes, openclaw: their answer).
    AllText,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    #[error("adapter binary not found: {0}")]
    NotFound(String),
}

/// The launch of `run` on `agent`; `search_path` overrides `PATH` for the lookup.
pub fn launch(
    agent: &AgentConfig,
    run: &CreateRun,
    search_path: Option<&OsStr>,
) -> Result<Launch, AdapterError> {
    let (launcher, default_bin): (&[String], &str) = match agent.runtime {
        Runtime::Exec => (&agent.command, ""),
        Runtime::Hermes => (&agent.command, "hermes"),
        Runtime::Openclaw => (&agent.command, "openclaw"),
    };
    let (bin, mut args) = match launcher.split_first() {
        Some((bin, rest)) => (bin.clone(), rest.to_vec()),
        None => (default_bin.to_owned(), Vec::new()),
    };
    let program = find_program(&bin, search_path).ok_or(AdapterError::NotFound(bin))?;
    let model = agent.model_configured.then_some(agent.model.as_str());
    match agent.runtime {
        Runtime::Exec => {}
        Runtime::Hermes => {
            args.extend(["chat", "--quiet", "--query", &run.goal].map(String::from));
            if let Some(m) = model {
                args.extend(["--model".to_owned(), m.to_owned()]);
            }
            let tools = if run.constraints.tools.is_empty() {
                &agent.tools
            } else {
                &run.constraints.tools
            };
            if !tools.is_empty() {
                args.extend(["--toolsets".to_owned(), tools.join(",")]);
            }
        }
        Runtime::Openclaw => {
            args.extend(
                [
                    "agent",
                    "--local",
                    "--session-id",
                    &format!("switchyard-{}", run.run_id),
                    "--message",
                    &run.goal,
                ]
                .map(String::from),
            );
            if let Some(m) = model {
                args.extend(["--model".to_owned(), m.to_owned()]);
            }
            if let Some(t) = run.constraints.timeout_seconds.filter(|&t| t > 0) {
                args.extend(["--timeout".to_owned(), t.to_string()]);
            }
        }
    }
    Ok(Launch {
        program,
        args,
        goal_on_stdin: agent.runtime == Runtime::Exec,
        summary: match agent.runtime {
            Runtime::Exec => SummaryMode::LastLine,
            Runtime::Hermes | Runtime::Openclaw => SummaryMode::AllText,
        },
    })
}

/// `name` as an executable file: a path when it has a `/`, else looked up on `search_path`
/// (or `PATH`).
pub fn find_program(name: &str, search_path: Option<&OsStr>) -> Option<PathBuf> {
    if name.is_empty() {
        return None;
    }
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_executable(&p).then_some(p);
    }
    let path: OsString = match search_path {
        Some(p) => p.to_owned(),
        None => std::env::var_os("PATH")?,
    };
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AgentIds, HostConfig};
    use switchyard_protocol::hosts::message::{ContextBundle, RunConstraints};

    fn agent(toml: &str) -> AgentConfig {
        HostConfig::parse(toml, &mut AgentIds::default())
            .unwrap()
            .agents
            .remove(0)
    }

    fn run() -> CreateRun {
        CreateRun {
            run_id: "r1".into(),
            agent_id: "a".into(),
            goal: "Research GRPO papers".into(),
            context_bundle: ContextBundle::default(),
            constraints: RunConstraints {
                max_tokens: None,
                timeout_seconds: Some(600),
                tools: vec!["terminal".into(), "browser".into()],
            },
        }
    }

    fn fake_bin(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn exec_runs_its_command() {
        let a = agent("[[agents]]\nruntime = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", \"x\"]");
        let l = launch(&a, &run(), None).unwrap();
        assert_eq!(l.program, PathBuf::from("/bin/sh"));
        assert_eq!(l.args, ["-c", "x"]);
        assert!(l.goal_on_stdin);
        assert_eq!(l.summary, SummaryMode::LastLine);
        let missing = agent("[[agents]]\nruntime = \"exec\"\ncommand = [\"/nonexistent/agent\"]");
        assert_eq!(
            launch(&missing, &run(), None).unwrap_err().to_string(),
            "adapter binary not found: /nonexistent/agent"
        );
    }

    #[test]
    fn hermes_and_openclaw_on_the_search_path() {
        let dir = tempfile::tempdir().unwrap();
        let search = dir.path().as_os_str();
        let h = agent("[[agents]]\nruntime = \"hermes\"\nmodel = \"anthropic/claude-sonnet-4\"");
        assert_eq!(
            launch(&h, &run(), Some(search)).unwrap_err(),
            AdapterError::NotFound("hermes".into())
        );
        let hermes = fake_bin(dir.path(), "hermes");
        let l = launch(&h, &run(), Some(search)).unwrap();
        assert_eq!(l.program, hermes);
        assert_eq!(
            l.args,
            [
                "chat",
                "--quiet",
                "--query",
                "Research GRPO papers",
                "--model",
                "anthropic/claude-sonnet-4",
                "--toolsets",
                "terminal,browser"
            ]
        );
        assert!(!l.goal_on_stdin);
        assert_eq!(l.summary, SummaryMode::AllText);

        let o = agent("[[agents]]\nruntime = \"openclaw\"\ntools = [\"x\"]");
        let openclaw = fake_bin(dir.path(), "openclaw");
        let l = launch(&o, &run(), Some(search)).unwrap();
        assert_eq!(l.program, openclaw);
        assert_eq!(
            l.args,
            [
                "agent",
                "--local",
                "--session-id",
                "switchyard-r1",
                "--message",
                "Research GRPO papers",
                "--timeout",
                "600"
            ]
        );
    }

    #[test]
    fn command_overrides_the_binary() {
        let dir = tempfile::tempdir().unwrap();
        let launcher = fake_bin(dir.path(), "uvx");
        let h = agent(&format!(
            "[[agents]]\nruntime = \"hermes\"\ncommand = [{:?}, \"hermes-agent\"]",
            launcher.display().to_string()
        ));
        let l = launch(&h, &run(), Some(OsStr::new("/nonexistent"))).unwrap();
        assert_eq!(l.program, launcher);
        assert_eq!(&l.args[..3], ["hermes-agent", "chat", "--quiet"]);
        // Not executable: not found.
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        assert!(find_program(plain.to_str().unwrap(), None).is_none());
        assert!(find_program("sh", None).is_some(), "PATH lookup");
    }
}
