//! `ListModels`: the model names a run may ask for. "auto" first; then, for each route the
//! receipt grants and this supervisor serves, its name, its model and the literal names it
//! claims; the glob patterns routes claim (`models = ["gpt-*"]`) apart, for information.
//! Any other name goes where "auto" would (`tollgate_router::decide::Requested::resolve`).

use tollgate_proto::v1 as pb;
use tollgate_router::config::{RouteKind, Routes};

/// The names `receipt` lets a run ask for on `routes`.
pub(crate) fn list(receipt: &pb::Receipt, routes: &Routes) -> pb::ListModelsResponse {
    let mut models = vec![pb::ModelName {
        name: "auto".into(),
        ..Default::default()
    }];
    let mut patterns = Vec::new();
    for grant in &receipt.routes {
        let Some(route) = routes.get(&grant.name) else {
            continue;
        };
        let named = |name: &str| pb::ModelName {
            name: name.to_owned(),
            route: route.name.clone(),
            model: route.model.clone(),
            local: route.kind == RouteKind::Local,
        };
        let mut add = |name: &str| {
            // The first route to claim a name serves it (the routes file's order).
            if !models.iter().any(|m| m.name == name) {
                models.push(named(name));
            }
        };
        add(&route.name);
        add(&route.model);
        for claimed in &route.models {
            if claimed.contains('*') {
                patterns.push(named(claimed));
            } else {
                add(claimed);
            }
        }
    }
    pb::ListModelsResponse { models, patterns }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_then_each_granted_route_its_model_and_claims() {
        let routes = Routes::parse(
            r#"
            [[route]]
            name = "local"
            kind = "local"
            preset = "vllm"
            endpoint = "http://127.0.0.1:8000"
            model = "qwen"
            models = ["gpt-4o-mini", "gpt-*"]

            [[route]]
            name = "claude"
            kind = "cloud"
            api = "anthropic"
            endpoint = "https://api.anthropic.com"
            model = "claude-sonnet-4-5"
            key_secret = "env:K"
            models = ["claude-*"]

            [[route]]
            name = "ungranted"
            kind = "local"
            preset = "vllm"
            endpoint = "http://127.0.0.1:8001"
            model = "secret-model"
            "#,
            "routes.toml",
        )
        .unwrap();
        let grant = |name: &str| pb::RouteGrant {
            name: name.into(),
            max_sensitivity: pb::Sensitivity::High as i32,
            ask: false,
        };
        let receipt = pb::Receipt {
            routes: vec![grant("local"), grant("claude"), grant("not-served")],
            ..Default::default()
        };
        let listed = list(&receipt, &routes);
        let names: Vec<(&str, &str, bool)> = listed
            .models
            .iter()
            .map(|m| (m.name.as_str(), m.route.as_str(), m.local))
            .collect();
        assert_eq!(
            names,
            [
                ("auto", "", false),
                ("local", "local", true),
                ("qwen", "local", true),
                ("gpt-4o-mini", "local", true),
                ("claude", "claude", false),
                ("claude-sonnet-4-5", "claude", false),
            ]
        );
        let patterns: Vec<(&str, &str)> = listed
            .patterns
            .iter()
            .map(|m| (m.name.as_str(), m.model.as_str()))
            .collect();
        assert_eq!(
            patterns,
            [("gpt-*", "qwen"), ("claude-*", "claude-sonnet-4-5")]
        );
    }
}
