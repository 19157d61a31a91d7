//! The providers' configuration sections. Each provider crate owns its section (a
//! [`ProviderFactory`]); the edge only loads the sections the factory list
//! (`crate::providers::factories`) names, without knowing their keys: `[name]` in the file
//! and `SWITCHYARD_<NAME>__<KEY>` in the environment, unknown keys refused like every other
//! table's.

use std::any::Any;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use figment::Figment;
use switchyard_core::provider::{Provider, ProviderFactory, ProviderServices, SharedSettings};

/// One provider's loaded section, its type erased.
pub trait LoadedSection: Send + Sync + Debug {
    fn name(&self) -> &'static str;
    fn as_any(&self) -> &dyn Any;
    fn clone_box(&self) -> Box<dyn LoadedSection>;
    fn to_json(&self) -> serde_json::Value;
    /// The same section with its settings read from `value` (the shape of [`Self::to_json`]).
    fn with_json(&self, value: serde_json::Value) -> Result<Box<dyn LoadedSection>, String>;
    fn validate(&self) -> Result<(), String>;
    /// The Card id and mount prefix of the provider it builds, so its services are made
    /// before it.
    fn card_id(&self) -> &'static str;
    fn prefix(&self) -> &'static str;
    fn build(
        &self,
        shared: &SharedSettings,
        services: Arc<dyn ProviderServices>,
    ) -> Arc<dyn Provider>;
}

/// A factory of the list, its type erased: what the configuration asks of a provider.
pub trait SectionFactory: Send + Sync {
    fn name(&self) -> &'static str;
    /// Its lines of `print-default-config`.
    fn default_toml(&self) -> &'static str;
    fn default_section(&self) -> Box<dyn LoadedSection>;
    /// The section from `fig` focused on it; errors carry paths within the section.
    fn load(&self, fig: &Figment) -> Result<Box<dyn LoadedSection>, Box<figment::Error>>;
    fn describe_metrics(&self);
}

/// The list entry of provider factory `F`.
pub fn factory<F: ProviderFactory>() -> Box<dyn SectionFactory> {
    Box::new(Entry::<F>(PhantomData))
}

struct Entry<F>(PhantomData<fn() -> F>);

struct Loaded<F: ProviderFactory>(F::Section);

impl<F: ProviderFactory> Debug for Loaded<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple(F::SECTION).field(&self.0).finish()
    }
}

impl<F: ProviderFactory> LoadedSection for Loaded<F> {
    fn name(&self) -> &'static str {
        F::SECTION
    }
    fn as_any(&self) -> &dyn Any {
        &self.0
    }
    fn clone_box(&self) -> Box<dyn LoadedSection> {
        Box::new(Loaded::<F>(self.0.clone()))
    }
    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.0).unwrap_or_default()
    }
    fn with_json(&self, value: serde_json::Value) -> Result<Box<dyn LoadedSection>, String> {
        let section = serde_json::from_value(value).map_err(|e| format!("{}: {e}", F::SECTION))?;
        Ok(Box::new(Loaded::<F>(section)))
    }
    fn validate(&self) -> Result<(), String> {
        F::validate(&self.0)
    }
    fn card_id(&self) -> &'static str {
        F::CARD_ID
    }
    fn prefix(&self) -> &'static str {
        F::PREFIX
    }
    fn build(
        &self,
        shared: &SharedSettings,
        services: Arc<dyn ProviderServices>,
    ) -> Arc<dyn Provider> {
        F::build(&self.0, shared, services)
    }
}

impl<F: ProviderFactory> SectionFactory for Entry<F> {
    fn name(&self) -> &'static str {
        F::SECTION
    }
    fn default_toml(&self) -> &'static str {
        F::DEFAULT_TOML
    }
    fn default_section(&self) -> Box<dyn LoadedSection> {
        Box::new(Loaded::<F>(F::Section::default()))
    }
    fn load(&self, fig: &Figment) -> Result<Box<dyn LoadedSection>, Box<figment::Error>> {
        Ok(Box::new(Loaded::<F>(fig.extract().map_err(Box::new)?)))
    }
    fn describe_metrics(&self) {
        F::describe_metrics();
    }
}

/// Every listed provider's section, in the list's order.
#[derive(Debug)]
pub struct ProviderSections(pub(super) Vec<Box<dyn LoadedSection>>);

impl Default for ProviderSections {
    fn default() -> Self {
        Self(
            crate::providers::factories()
                .iter()
                .map(|f| f.default_section())
                .collect(),
        )
    }
}

impl Clone for ProviderSections {
    fn clone(&self) -> Self {
        Self(self.0.iter().map(|s| s.clone_box()).collect())
    }
}

impl PartialEq for ProviderSections {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.name() == b.name() && a.to_json() == b.to_json())
    }
}

impl ProviderSections {
    /// A section as its settings' JSON (durations as written, `30s`), for checks and tests.
    pub fn get(&self, name: &str) -> Option<serde_json::Value> {
        self.0
            .iter()
            .find(|s| s.name() == name)
            .map(|s| s.to_json())
    }

    /// A section typed as its provider crate declares it.
    pub fn typed<T: 'static>(&self) -> Option<&T> {
        self.0.iter().find_map(|s| s.as_any().downcast_ref::<T>())
    }

    /// Sets one key of a section (`set("slack", "lease_ttl", "3s")`), as a file would: for
    /// programs and tests that build a [`super::Config`] in code.
    pub fn set(
        &mut self,
        section: &str,
        key: &str,
        value: impl Into<serde_json::Value>,
    ) -> Result<(), String> {
        let slot = self
            .0
            .iter_mut()
            .find(|s| s.name() == section)
            .ok_or_else(|| format!("no provider section `{section}` in this build"))?;
        let mut json = slot.to_json();
        let table = json
            .as_object_mut()
            .ok_or_else(|| format!("`{section}` is not a table"))?;
        if !table.contains_key(key) {
            return Err(format!("unknown key `{section}.{key}`"));
        }
        table.insert(key.to_owned(), value.into());
        *slot = slot.with_json(json)?;
        Ok(())
    }

    pub fn validate(&self) -> Result<(), String> {
        self.0.iter().try_for_each(|s| s.validate())
    }

    /// Every listed provider's section, in the list's order, to build them from.
    pub fn sections(&self) -> impl Iterator<Item = &dyn LoadedSection> {
        self.0.iter().map(|s| s.as_ref())
    }
}
