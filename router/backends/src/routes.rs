//! A supervisor's model routes: the routes file, its backends (keys loaded) and the
//! classifier, loaded once at start and shared by every run.

use std::path::Path;
use std::time::Duration;

use tollgate_router::config::{Routes, RoutesError};
use tollgate_router::{Classifier, ConfigError};

use crate::backends::{Backends, KeyError, ProbeError};

/// A supervisor's model routes: shared by every run.
#[derive(Debug)]
pub struct ModelRoutes {
    /// The routes and policy.
    pub routes: Routes,
    /// Their backends, keys loaded.
    pub backends: Backends,
    /// The classifier that judges each call's text.
    pub classifier: Classifier,
}

/// Why a supervisor's model routes could not be loaded: each says in one line what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The routes file could not be read, or is not valid.
    #[error(transparent)]
    Routes(#[from] RoutesError),
    /// A route's key could not be loaded (or the TLS client could not be set up).
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The classifier could not be built.
    #[error("the classifier: {0}")]
    Classifier(#[from] ConfigError),
    /// A local route's server did not answer its start-up probe, or does not list the
    /// route's model.
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

impl ModelRoutes {
    /// Reads the routes file at `path`, loads its keys, builds the classifier, then probes
    /// every local route (all within `probe_timeout`; see [`Backends::probe_local`]), in
    /// that order. Cloud routes are not contacted.
    pub async fn load(path: &Path, probe_timeout: Duration) -> Result<Self, LoadError> {
        let routes = Routes::load(path)?;
        let backends = Backends::new(&routes)?;
        let classifier = Classifier::new(&routes.policy.classifier_config())?;
        backends.probe_local(&routes, probe_timeout).await?;
        Ok(Self {
            routes,
            backends,
            classifier,
        })
    }
}
