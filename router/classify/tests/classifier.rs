//! Classifier behaviour beyond the corpus: configuration, custom patterns, errors, redaction.

use tollgate_classify::{
    Classifier, ClassifierConfig, ConfigError, CustomPattern, Sensitivity,
    DEFAULT_INTERNAL_SUFFIXES,
};

fn default_classifier() -> Classifier {
    Classifier::new(&ClassifierConfig::default()).unwrap()
}

fn ids(classifier: &Classifier, text: &str) -> Vec<String> {
    classifier
        .classify(text)
        .reasons
        .iter()
        .map(|r| r.detector.to_string())
        .collect()
}

#[test]
fn classifier_is_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Classifier>();
}

#[test]
fn sensitivity_is_the_highest_reason() {
    let c = default_classifier();
    assert_eq!(
        c.classify("nothing to see here").sensitivity,
        Sensitivity::Low
    );
    assert_eq!(c.classify("ask db01.corp").sensitivity, Sensitivity::Medium);
    let both = c.classify("ask db01.corp with card 4111 1111 1111 1111");
    assert_eq!(both.sensitivity, Sensitivity::High);
    assert_eq!(both.reasons.len(), 2);
    assert!(c.classify("").reasons.is_empty());
}

#[test]
fn redaction_replaces_spans_with_markers() {
    let c = default_classifier();
    let text = "card 4111 1111 1111 1111, mail jane.doe@acme-corp.io, DB_PASSWORD=Tr0ub4dor&3";
    assert_eq!(
        c.redact(text).unwrap(),
        "card [REDACTED:credit_card], mail [REDACTED:email], DB_PASSWORD=[REDACTED:secret_assignment]"
    );
    assert_eq!(c.redact("plain words"), None);
    // A classification applied to a different text fails closed.
    let classification = c.classify(text);
    assert_eq!(classification.redact("short"), "[REDACTED:mismatch]");
}

#[test]
fn custom_patterns_are_detected_and_redacted() {
    let config = ClassifierConfig {
        custom: vec![
            CustomPattern {
                id: "project_codename".into(),
                regex: r"\bPROJECT-(?:ORCA|KESTREL)\b".into(),
                sensitivity: Sensitivity::Medium,
            },
            CustomPattern {
                id: "employee_id".into(),
                regex: r"\bemp(?:loyee)?[ _-]?id[:= ]+(?P<value>E[0-9]{6})\b".into(),
                sensitivity: Sensitivity::High,
            },
        ],
        ..ClassifierConfig::default()
    };
    let c = Classifier::new(&config).unwrap();
    let text = "Status of PROJECT-ORCA for employee id: E123456 — not PROJECT-ORCAS";
    let classification = c.classify(text);
    assert_eq!(classification.sensitivity, Sensitivity::High);
    assert_eq!(
        ids(&c, text),
        vec!["project_codename".to_owned(), "employee_id".to_owned()]
    );
    // Only the `value` group is reported.
    assert_eq!(&text[classification.reasons[1].span.clone()], "E123456");
    assert_eq!(
        c.redact(text).unwrap(),
        "Status of [REDACTED:project_codename] for employee id: [REDACTED:employee_id] — not PROJECT-ORCAS"
    );
    assert!(c
        .detectors()
        .any(|(id, s)| id == "employee_id" && s == Sensitivity::High));
}

#[test]
fn bad_custom_patterns_are_clear_errors() {
    let bad = |id: &str, regex: &str| {
        Classifier::new(&ClassifierConfig {
            custom: vec![CustomPattern {
                id: id.into(),
                regex: regex.into(),
                sensitivity: Sensitivity::High,
            }],
            ..ClassifierConfig::default()
        })
        .unwrap_err()
    };
    let err = bad("ticket", r"TICKET-(\d+");
    assert!(matches!(&err, ConfigError::BadPattern { id, .. } if id == "ticket"));
    let message = err.to_string();
    assert!(message.contains("\"ticket\"") && message.contains("not a valid regex"));
    assert!(std::error::Error::source(&err).is_some());

    assert!(matches!(
        bad("empty", r"x*"),
        ConfigError::MatchesEmpty { .. }
    ));
    assert!(matches!(bad("has space", r"x"), ConfigError::BadId { .. }));
    assert!(matches!(bad("", r"x"), ConfigError::BadId { .. }));
    assert!(matches!(
        bad("email", r"x"),
        ConfigError::DuplicateId { .. }
    ));
    assert!(matches!(
        bad("high_entropy", r"x"),
        ConfigError::DuplicateId { .. }
    ));

    let twice = Classifier::new(&ClassifierConfig {
        custom: vec![
            CustomPattern {
                id: "a".into(),
                regex: "aa".into(),
                sensitivity: Sensitivity::Low,
            },
            CustomPattern {
                id: "a".into(),
                regex: "bb".into(),
                sensitivity: Sensitivity::Low,
            },
        ],
        ..ClassifierConfig::default()
    });
    assert!(matches!(twice, Err(ConfigError::DuplicateId { .. })));
}

#[test]
fn other_config_errors() {
    let with = |f: &dyn Fn(&mut ClassifierConfig)| {
        let mut config = ClassifierConfig::default();
        f(&mut config);
        Classifier::new(&config)
    };
    assert!(matches!(
        with(&|c| c.internal_suffixes = vec!["bad suffix".into()]),
        Err(ConfigError::BadSuffix { .. })
    ));
    assert!(matches!(
        with(&|c| c.disabled = vec!["no_such_detector".into()]),
        Err(ConfigError::UnknownDetector { .. })
    ));
    assert!(matches!(
        with(&|c| c.entropy_threshold = f64::NAN),
        Err(ConfigError::BadEntropy)
    ));
    assert!(matches!(
        with(&|c| c.entropy_min_len = 4),
        Err(ConfigError::BadEntropy)
    ));
}

#[test]
fn entropy_length_bounds_build() {
    for min_len in [16, 64] {
        let c = Classifier::new(&ClassifierConfig {
            entropy_min_len: min_len,
            ..ClassifierConfig::default()
        })
        .unwrap();
        let token = "f7EbsDe0G9Cryn687neLfjVHq8xiM0OGr4hTxoF5";
        let found = !ids(&c, token).is_empty();
        assert_eq!(found, token.len() >= min_len, "min_len {min_len}");
    }
}

#[test]
fn internal_suffixes_are_configurable() {
    let c = Classifier::new(&ClassifierConfig {
        internal_suffixes: vec![".svc.cluster.local".into(), "ACME-INT".into()],
        ..ClassifierConfig::default()
    })
    .unwrap();
    assert_eq!(
        ids(&c, "curl http://api.default.svc.cluster.local/health"),
        vec!["internal_hostname".to_owned()]
    );
    assert_eq!(
        ids(&c, "ping build01.acme-int"),
        vec!["internal_hostname".to_owned()]
    );
    assert!(ids(&c, "printer.local").is_empty());
    assert_eq!(DEFAULT_INTERNAL_SUFFIXES.len(), 7);

    let none = Classifier::new(&ClassifierConfig {
        internal_suffixes: Vec::new(),
        ..ClassifierConfig::default()
    })
    .unwrap();
    assert!(ids(&none, "db.prod.internal").is_empty());
    assert!(none.detectors().all(|(id, _)| id != "internal_hostname"));
}

#[test]
fn detectors_can_be_disabled_and_entropy_lowered() {
    let c = Classifier::new(&ClassifierConfig {
        disabled: vec!["phone".into(), "email".into()],
        entropy_sensitivity: Sensitivity::Medium,
        ..ClassifierConfig::default()
    })
    .unwrap();
    assert!(ids(&c, "call +1 415 555 0132 or jane.doe@acme-corp.io").is_empty());
    let token = c.classify("session f7EbsDe0G9Cryn687neLfjVHq8xiM0OGr4hTxoF5");
    assert_eq!(token.sensitivity, Sensitivity::Medium);
}

#[test]
fn builtin_list_matches_docs() {
    let builtins: Vec<_> = Classifier::builtin_detectors().collect();
    assert_eq!(builtins.len(), 35);
    assert_eq!(builtins.last().unwrap().0, "high_entropy");
    let medium: Vec<_> = builtins
        .iter()
        .filter(|(_, s)| *s == Sensitivity::Medium)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        medium,
        vec![
            "private_ipv4",
            "private_ipv6",
            "internal_unc_path",
            "bare_host_url",
            "internal_hostname"
        ]
    );
    // Every detector has a description, which is what reasons say instead of the text.
    for (id, _) in &builtins {
        assert_ne!(Classifier::describe(id), "operator pattern", "{id}");
    }
}

/// The product's reference policy: each example classifies at the level the table gives, and
/// its reason names the pattern, never the text.
#[test]
fn the_reference_policy_table_holds() {
    let c = default_classifier();
    let table = [
        (
            "Please email user@company.com today",
            Sensitivity::High,
            "email address",
        ),
        (
            "api_key = \"sk-live-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c\"",
            Sensitivity::High,
            "credential assigned to a key",
        ),
        (
            "password: Tr0ub4dor&3",
            Sensitivity::High,
            "credential assigned to a key",
        ),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq9\n-----END RSA PRIVATE KEY-----",
            Sensitivity::High,
            "private key",
        ),
        (
            "aws key AKIAIOSFODNN7EXAMPLE",
            Sensitivity::High,
            "AWS access key id",
        ),
        ("db.internal.corp.com", Sensitivity::Medium, "internal host"),
        (
            "Connect to db.internal.company.com",
            Sensitivity::Medium,
            "internal host",
        ),
        (
            "ping 192.168.1.100",
            Sensitivity::Medium,
            "private IPv4 address",
        ),
    ];
    for (text, level, why) in table {
        let found = c.classify(text);
        assert_eq!(found.sensitivity, level, "{text}: {:?}", found.reasons);
        assert!(
            found.reasons.iter().any(|r| r.description == why),
            "{text}: {:?}",
            found.reasons
        );
        for reason in &found.reasons {
            assert!(!reason.to_string().contains(&text[reason.span.clone()]));
        }
    }
    for public in [
        "What is the capital of France?",
        "Summarise the plot of Hamlet in three sentences.",
        "How do I sort a list in Python?",
    ] {
        assert_eq!(c.classify(public).sensitivity, Sensitivity::Low, "{public}");
    }
}

/// Every level is the organisation's to set: a detector's id names it.
#[test]
fn levels_are_configurable_per_detector() {
    let c = Classifier::new(&ClassifierConfig {
        levels: [
            ("email".to_owned(), Sensitivity::Medium),
            ("private_ipv4".to_owned(), Sensitivity::Low),
        ]
        .into_iter()
        .collect(),
        ..ClassifierConfig::default()
    })
    .unwrap();
    assert_eq!(
        c.classify("mail jane.doe@acme-corp.io").sensitivity,
        Sensitivity::Medium
    );
    assert_eq!(c.classify("ping 10.1.2.3").sensitivity, Sensitivity::Low);
    let unknown = Classifier::new(&ClassifierConfig {
        levels: [("emails".to_owned(), Sensitivity::Low)]
            .into_iter()
            .collect(),
        ..ClassifierConfig::default()
    });
    assert!(unknown.is_err());
}

#[test]
fn adversarial_inputs_finish() {
    // Each would rescan quadratically without the rescan limit; no timing assertion, the test
    // simply has to finish.
    let c = default_classifier();
    let long_local = format!("{}@example.com", "a.".repeat(200_000));
    assert!(c.classify(&long_local).reasons.is_empty());
    let blob = "Ab1+".repeat(250_000);
    assert!(c.classify(&blob).reasons.is_empty());
    let digits = "4111 ".repeat(200_000);
    let _ = c.classify(&digits);
    let unicode = "é東".repeat(200_000);
    assert!(c.classify(&unicode).reasons.is_empty());
}

/// Tool calls travel as JSON, often JSON inside a JSON string: escapes are read as what they
/// stand for, spans still point into the text as sent, and the APIs' ids are not secrets.
#[test]
fn escaped_json_and_api_ids_are_read_as_they_are_meant() {
    let c = default_classifier();
    // A key on a line of its own in a file written through a tool call: `\nAKIA...`.
    let args = r#"{"path": "notes.md", "content": "Rotated keys:\nAKIABZ2I3JSADCTHADCA\n"}"#;
    assert_eq!(ids(&c, args), vec!["aws_access_key_id"]);
    // The same arguments as OpenAI carries them, a JSON string (`\\n`, `\"`).
    let carried = format!(
        r#"{{"arguments": "{}"}}"#,
        args.replace('\\', r"\\").replace('"', r#"\""#)
    );
    assert_eq!(ids(&c, &carried), vec!["aws_access_key_id"]);
    assert_eq!(
        c.redact(&carried).unwrap(),
        r#"{"arguments": "{\"path\": \"notes.md\", \"content\": \"Rotated keys:\\n[REDACTED:aws_access_key_id]\\n\"}"}"#
    );
    // An escaped pair reads as a pair; the redaction keeps the escaped quotes around it.
    let pair = r#"{\"password\": \"hunter2!x9\"}"#;
    assert_eq!(
        c.redact(pair).unwrap(),
        r#"{\"password\": \"[REDACTED:secret_assignment]\"}"#
    );
    // The APIs' own ids, in their shapes, are not secrets.
    let ids_only = "call_4MFoVrqQpvYGH2QYAuhSd5Ot toolu_01D7FLrfh4GYq7yT1ULFeyMV \
                    chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT msg_01XFDUDYJgAACzvnptvVoYEL";
    assert_eq!(c.classify(ids_only).sensitivity, Sensitivity::Low);
    // A prefix glued to a random secret hides nothing, not even under an id key.
    let glued = "call_tw5VDidyGcqyoveWCzAFQDaoGOD1hP0LuK0o3gW";
    assert_eq!(ids(&c, glued), vec!["high_entropy"]);
    assert_eq!(
        ids(&c, &format!(r#"{{"id": "{glued}"}}"#)),
        vec!["high_entropy"]
    );
    // A random id under an id key is an id; under a session key it is a credential.
    let random = "Xb7kQ2mZp9Lr4Tw8Vn3Yc6Hd1Jf5Gs0A";
    assert!(ids(&c, &format!(r#"{{"tool_call_id": "{random}"}}"#)).is_empty());
    assert_eq!(
        ids(&c, &format!(r#"{{"session_id": "{random}"}}"#)),
        vec!["high_entropy"]
    );
}

/// A digest is known only at its algorithm's own length: `sha256:` glued to a secret of
/// another length does not make the secret a digest (before, any 22 to 128 characters after
/// `sha256:` were taken as one, hiding an AWS key id).
#[test]
fn an_algorithm_label_hides_nothing_but_a_digest_of_its_length() {
    let classifier = default_classifier();
    let alone = classifier
        .classify("key AKIAIOSFODNN7EXAMPLE/x")
        .sensitivity;
    assert!(alone > Sensitivity::Low);
    assert_eq!(
        classifier
            .classify("sha256:AKIAIOSFODNN7EXAMPLE/x")
            .sensitivity,
        alone
    );
    for digest in [
        "sha256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s",
        "md5:d41d8cd98f00b204e9800998ecf8427e",
    ] {
        assert_eq!(
            classifier.classify(digest).sensitivity,
            Sensitivity::Low,
            "{digest}"
        );
    }
}
