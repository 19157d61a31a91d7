//! The host agent's config file (TOML): the agents this host offers.
//!
//! ```toml
//! kill_grace_s = 5            # SIGTERM -> SIGKILL delay when a run is cancelled
//!
//! [[agents]]
//! name = "builder"            # optional local label; keys the generated agent_id
//! runtime = "exec"            # exec | hermes | openclaw
//! command = ["/usr/local/bin/build-agent", "--fast"]
//! model = "none"
//! tools = ["terminal"]
//! max_turns = 10
//! supports = ["streaming", "cancellation"]
//! max_concurrent_runs = 2
//! risky = ["rm -rf", "git push*"]
//! ```
//!
//! Parsed once at start and validated; every problem is reported with the agent it concerns.
//! An `agent_id` left out is generated once and kept in `STATE_DIR/agents.json`, keyed by the
//! agent's `name` (or its position when it has none), so it survives restarts.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use switchyard_protocol::hosts::message::{AgentCapabilities, Capabilities, Feature};

use crate::risky::RiskyPatterns;

/// The file in the state dir that keeps generated agent ids.
pub const AGENT_IDS_FILE: &str = "agents.json";

/// Default SIGTERM -> SIGKILL delay.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

/// Why a config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid: {detail}")]
    BadStateFile { path: PathBuf, detail: String },
    #[error("config is not valid TOML: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("config: {0}")]
    Invalid(String),
}

/// The adapter that runs an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runtime {
    /// Any program speaking the exec line protocol (see the README).
    Exec,
    /// Hermes Agent (Nous Research).
    Hermes,
    /// OpenClaw.
    Openclaw,
}

impl Runtime {
    pub const ALL: [Self; 3] = [Self::Exec, Self::Hermes, Self::Openclaw];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Hermes => "hermes",
            Self::Openclaw => "openclaw",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One agent, validated.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub agent_id: String,
    pub name: Option<String>,
    pub runtime: Runtime,
    /// The model announced in `capabilities` (the runtime's name when not configured).
    pub model: String,
    /// True when `model` was configured: only then is it passed to hermes/openclaw.
    pub model_configured: bool,
    pub tools: Vec<String>,
    pub max_turns: u32,
    pub supports: Vec<Feature>,
    pub max_concurrent_runs: u32,
    /// exec: the argv to run; hermes/openclaw: an optional launcher replacing the binary.
    pub command: Vec<String>,
    pub risky: RiskyPatterns,
}

/// The whole config, validated.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub agents: Vec<AgentConfig>,
    pub kill_grace: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    kill_grace_s: Option<f64>,
    #[serde(default)]
    agents: Vec<RawAgent>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    agent_id: Option<String>,
    name: Option<String>,
    runtime: String,
    model: Option<String>,
    #[serde(default)]
    tools: Vec<String>,
    max_turns: Option<u32>,
    supports: Option<Vec<Feature>>,
    max_concurrent_runs: Option<u32>,
    command: Option<Vec<String>>,
    #[serde(default)]
    risky: Vec<String>,
}

/// Generated agent ids, kept in `agents.json` (`{"name:builder": "uuid", "index:1": "uuid"}`).
#[derive(Debug, Default)]
pub struct AgentIds {
    ids: BTreeMap<String, String>,
    changed: bool,
}

impl AgentIds {
    pub fn load(state_dir: &Path) -> Result<Self, ConfigError> {
        let path = state_dir.join(AGENT_IDS_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let ids = serde_json::from_str(&text).map_err(|e| ConfigError::BadStateFile {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
                Ok(Self {
                    ids,
                    changed: false,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    /// Writes the file when an id was generated since loading.
    pub fn save(&mut self, state_dir: &Path) -> Result<(), ConfigError> {
        if !self.changed {
            return Ok(());
        }
        let path = state_dir.join(AGENT_IDS_FILE);
        let text = serde_json::to_string_pretty(&self.ids).unwrap_or_default();
        crate::state::write_atomic(&path, text.as_bytes(), 0o644)
            .map_err(|source| ConfigError::Write { path, source })?;
        self.changed = false;
        Ok(())
    }

    fn get_or_create(&mut self, key: String) -> String {
        if let Some(id) = self.ids.get(&key) {
            return id.clone();
        }
        let id = crate::ids::new_uuid();
        self.ids.insert(key, id.clone());
        self.changed = true;
        id
    }
}

impl HostConfig {
    /// Reads and validates `path`; generated agent ids are kept in `state_dir`.
    pub fn load(path: &Path, state_dir: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut ids = AgentIds::load(state_dir)?;
        let config = Self::parse(&text, &mut ids)?;
        ids.save(state_dir)?;
        Ok(config)
    }

    /// Parses and validates config text.
    pub fn parse(text: &str, ids: &mut AgentIds) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text)?;
        let kill_grace = match raw.kill_grace_s {
            None => DEFAULT_KILL_GRACE,
            Some(s) if (0.0..=3600.0).contains(&s) => Duration::from_secs_f64(s),
            Some(s) => {
                return Err(ConfigError::Invalid(format!(
                    "kill_grace_s must be between 0 and 3600 seconds, not {s}"
                )));
            }
        };
        if raw.agents.is_empty() {
            return Err(ConfigError::Invalid(
                "no agents: add at least one [[agents]] table".into(),
            ));
        }
        let mut agents = Vec::with_capacity(raw.agents.len());
        let mut names = HashSet::new();
        let mut agent_ids = HashSet::new();
        for (i, a) in raw.agents.into_iter().enumerate() {
            let label = match &a.name {
                Some(n) => format!("agents[{i}] ({n:?})"),
                None => format!("agents[{i}]"),
            };
            let bad = |detail: String| ConfigError::Invalid(format!("{label}: {detail}"));
            let runtime = Runtime::parse(&a.runtime).ok_or_else(|| {
                bad(format!(
                    "unknown runtime {:?}, expected one of exec, hermes, openclaw",
                    a.runtime
                ))
            })?;
            if let Some(name) = &a.name {
                if name.trim().is_empty() {
                    return Err(bad("name must not be empty".into()));
                }
                if !names.insert(name.clone()) {
                    return Err(bad(format!("name {name:?} is used twice")));
                }
            }
            let agent_id = match a.agent_id {
                Some(id) if id.trim().is_empty() => {
                    return Err(bad(
                        "agent_id must not be empty (leave it out to generate one)".into(),
                    ));
                }
                Some(id) => id,
                None => ids.get_or_create(match &a.name {
                    Some(n) => format!("name:{n}"),
                    None => format!("index:{i}"),
                }),
            };
            if !agent_ids.insert(agent_id.clone()) {
                return Err(bad(format!("agent_id {agent_id:?} is used twice")));
            }
            let command = a.command.unwrap_or_default();
            if command.iter().any(|c| c.is_empty()) {
                return Err(bad("command must not contain empty strings".into()));
            }
            if runtime == Runtime::Exec && command.is_empty() {
                return Err(bad(
                    "runtime exec needs command = [\"program\", \"arg\", ...]".into(),
                ));
            }
            let max_concurrent_runs = a.max_concurrent_runs.unwrap_or(1);
            if max_concurrent_runs == 0 {
                return Err(bad("max_concurrent_runs must be at least 1".into()));
            }
            if a.risky.iter().any(|p| p.is_empty()) {
                return Err(bad("risky patterns must not be empty".into()));
            }
            if a.tools.iter().any(|t| t.is_empty()) {
                return Err(bad("tools must not contain empty strings".into()));
            }
            let (model, model_configured) = match a.model {
                Some(m) if m.trim().is_empty() => {
                    return Err(bad("model must not be empty (leave it out instead)".into()));
                }
                Some(m) => (m, true),
                None => (runtime.as_str().to_owned(), false),
            };
            let mut supports = a
                .supports
                .unwrap_or_else(|| vec![Feature::Streaming, Feature::Cancellation]);
            supports.dedup();
            agents.push(AgentConfig {
                agent_id,
                name: a.name,
                runtime,
                model,
                model_configured,
                tools: a.tools,
                max_turns: a.max_turns.unwrap_or(0),
                supports,
                max_concurrent_runs,
                command,
                risky: RiskyPatterns::new(&a.risky),
            });
        }
        Ok(Self { agents, kill_grace })
    }

    /// The `capabilities` message body.
    pub fn capabilities(&self, connector_id: &str) -> Capabilities {
        Capabilities {
            connector_id: connector_id.to_owned(),
            agents: self
                .agents
                .iter()
                .map(|a| AgentCapabilities {
                    agent_id: a.agent_id.clone(),
                    runtime: a.runtime.as_str().to_owned(),
                    model: a.model.clone(),
                    tools: a.tools.clone(),
                    max_turns: a.max_turns,
                    supports: a.supports.clone(),
                })
                .collect(),
        }
    }

    /// The runtimes configured, each once (`register.adapters`).
    pub fn adapters(&self) -> Vec<String> {
        let mut r: Vec<Runtime> = self.agents.iter().map(|a| a.runtime).collect();
        r.sort();
        r.dedup();
        r.into_iter().map(|r| r.as_str().to_owned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HostConfig, ConfigError> {
        HostConfig::parse(text, &mut AgentIds::default())
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn full_config() {
        let c = parse(
            r#"
            kill_grace_s = 1.5
            [[agents]]
            agent_id = "a1"
            runtime = "exec"
            command = ["/bin/sh", "-c", "echo hi"]
            model = "none"
            tools = ["terminal"]
            max_turns = 10
            supports = ["streaming", "cancellation", "handoff"]
            max_concurrent_runs = 3
            risky = ["rm -rf", "git push*"]

            [[agents]]
            name = "researcher"
            runtime = "hermes"
            model = "anthropic/claude-sonnet-4"

            [[agents]]
            runtime = "openclaw"
            command = ["/opt/openclaw/bin/openclaw"]
            "#,
        )
        .unwrap();
        assert_eq!(c.kill_grace, Duration::from_millis(1500));
        let a = &c.agents[0];
        assert_eq!(a.agent_id, "a1");
        assert_eq!(a.runtime, Runtime::Exec);
        assert_eq!(a.command, ["/bin/sh", "-c", "echo hi"]);
        assert_eq!(a.max_concurrent_runs, 3);
        assert!(a.risky.matches("git push origin"));
        assert_eq!(a.supports.len(), 3);
        let h = &c.agents[1];
        assert_eq!(h.runtime, Runtime::Hermes);
        assert!(h.model_configured);
        assert_eq!(h.max_concurrent_runs, 1, "default");
        assert_eq!(h.supports, [Feature::Streaming, Feature::Cancellation]);
        let o = &c.agents[2];
        assert_eq!(o.model, "openclaw");
        assert!(!o.model_configured);
        assert_eq!(o.max_turns, 0);
        assert_eq!(c.adapters(), ["exec", "hermes", "openclaw"]);
        let caps = c.capabilities("host-1");
        assert_eq!(caps.connector_id, "host-1");
        assert_eq!(caps.agents.len(), 3);
        assert_eq!(caps.agents[1].runtime, "hermes");
        assert_eq!(caps.agents[1].agent_id, h.agent_id);
        // The capabilities message passes the protocol's own validation.
        let msg = switchyard_protocol::hosts::HostMessage::Capabilities(caps);
        switchyard_protocol::hosts::parse(&msg.to_json()).unwrap();
    }

    #[test]
    fn generated_ids_are_stable_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("host.toml");
        std::fs::write(
            &cfg,
            "[[agents]]\nname = \"x\"\nruntime = \"hermes\"\n[[agents]]\nruntime = \"openclaw\"\n",
        )
        .unwrap();
        let a = HostConfig::load(&cfg, dir.path()).unwrap();
        let b = HostConfig::load(&cfg, dir.path()).unwrap();
        assert_ne!(a.agents[0].agent_id, a.agents[1].agent_id);
        for (x, y) in a.agents.iter().zip(&b.agents) {
            assert_eq!(x.agent_id, y.agent_id);
            assert_eq!(x.agent_id.len(), 36);
        }
        let saved = std::fs::read_to_string(dir.path().join(AGENT_IDS_FILE)).unwrap();
        assert!(
            saved.contains("name:x") && saved.contains("index:1"),
            "{saved}"
        );
        // A named agent keeps its id when it moves.
        std::fs::write(
            &cfg,
            "[[agents]]\nruntime = \"openclaw\"\n[[agents]]\nname = \"x\"\nruntime = \"hermes\"\n",
        )
        .unwrap();
        let c = HostConfig::load(&cfg, dir.path()).unwrap();
        assert_eq!(c.agents[1].agent_id, a.agents[0].agent_id);
    }

    #[test]
    fn validation_errors_are_clear() {
        assert_eq!(
            err("[[agents]]\nruntime = \"docker\""),
            "config: agents[0]: unknown runtime \"docker\", expected one of exec, hermes, openclaw"
        );
        assert!(
            err("[[agents]]\nruntime = \"exec\"").contains("runtime exec needs command"),
            "exec without command"
        );
        assert!(err("").contains("no agents"));
        assert!(
            err("[[agents]]\nruntime = \"hermes\"\nmax_concurrent_runs = 0")
                .contains("max_concurrent_runs must be at least 1")
        );
        assert!(
            err("[[agents]]\nagent_id = \"a\"\nruntime = \"hermes\"\n[[agents]]\nagent_id = \"a\"\nruntime = \"hermes\"")
                .contains("agents[1]: agent_id \"a\" is used twice")
        );
        assert!(
            err("[[agents]]\nname = \"n\"\nruntime = \"hermes\"\n[[agents]]\nname = \"n\"\nruntime = \"hermes\"")
                .contains("agents[1] (\"n\"): name \"n\" is used twice")
        );
        assert!(err("[[agents]]\nruntime = \"hermes\"\nrisky = [\"\"]").contains("risky"));
        assert!(err("[[agents]]\nruntime = \"hermes\"\nagent_id = \" \"").contains("agent_id"));
        assert!(err("[[agents]]\nruntime = \"hermes\"\nmodel = \"\"").contains("model"));
        let typo = err("[[agents]]\nruntime = \"hermes\"\nmax_turn = 3");
        assert!(typo.contains("unknown field `max_turn`"), "{typo}");
        let feature = err("[[agents]]\nruntime = \"hermes\"\nsupports = [\"teleport\"]");
        assert!(feature.contains("teleport"), "{feature}");
        assert!(
            err("kill_grace_s = -1\n[[agents]]\nruntime = \"hermes\"").contains("kill_grace_s")
        );
        assert!(err("[[agents]]\nruntime = \"exec\"\ncommand = [\"\"]").contains("empty"));
    }
}
