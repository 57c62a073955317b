//! The Kubernetes manifests in `deploy/kubernetes` validate strictly against the Kubernetes
//! schemas (the `kubernetes-validate` package `scripts/test` installs into the test Python),
//! and the validator is live: a manifest with a misspelt field fails it. They name the image
//! `scripts/build-image` builds from `deploy/Containerfile`, which holds the four binaries and
//! nothing else of the build (checked without building it: no container engine here).

use std::path::PathBuf;
use std::process::Command;

fn python() -> String {
    std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn manifests() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// Runs the validator on `files`: its exit status and what it said.
fn validate(files: &[PathBuf]) -> (bool, String) {
    let output = Command::new(python())
        .args(["-m", "kubernetes_validate", "--strict", "--no-warn"])
        .args(["--kubernetes-version", "1.31.0"])
        .args(files)
        .output()
        .expect("run python");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !said.contains("No module named kubernetes_validate"),
        "{} lacks kubernetes-validate: run scripts/test (it installs tests/python/requirements.txt) or set TOLLGATE_PYTHON",
        python()
    );
    (output.status.success(), said)
}

#[test]
fn the_kubernetes_manifests_validate_against_the_schemas() {
    let files = manifests();
    let names: Vec<_> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["authority.yaml", "namespace.yaml", "supervisor.yaml"],
        "the manifests this test knows"
    );
    let (passed, said) = validate(&files);
    assert!(passed, "{said}");
    for resource in [
        "statefulset/tollgate-authority",
        "service/tollgate-authority",
        "daemonset/tollgate-supervisor",
        "namespace/tollgate",
    ] {
        assert!(
            said.contains(&format!("passed for resource {resource}")),
            "{said}"
        );
    }

    // The same DaemonSet with one field misspelt: refused.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("supervisor.yaml");
    let text = std::fs::read_to_string(&files[2]).unwrap();
    std::fs::write(
        &broken,
        text.replacen("readinessProbe:", "readynessProbe:", 1),
    )
    .unwrap();
    let (passed, said) = validate(&[broken]);
    assert!(!passed, "a misspelt field passed: {said}");
}

/// The repository root.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The binaries the image holds, each one the project builds.
const IMAGE_BINARIES: [&str; 4] = [
    "tollgate",
    "tollgate-authority",
    "tollgate-supervisor",
    "tollgate-shim",
];

/// `deploy/Containerfile`'s instructions, one per entry (continuation lines joined, comments
/// left out), each split into its keyword and the rest.
fn containerfile() -> Vec<(String, String)> {
    let path = repo().join("deploy/Containerfile");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                let joined = std::mem::take(&mut current);
                let (keyword, rest) = joined
                    .split_once(char::is_whitespace)
                    .unwrap_or((&joined, ""));
                instructions.push((keyword.to_uppercase(), rest.trim().to_owned()));
            }
        }
    }
    instructions
}

/// (manifest file name, a value in it), in file order.
type ManifestValues = Vec<(String, String)>;

/// Each manifest's `image:` values and the first of each container's `args` (the program),
/// read line by line (the manifests keep one `image:` and one `args:` list per container).
fn manifest_images_and_programs() -> (ManifestValues, ManifestValues) {
    let mut images = Vec::new();
    let mut programs = Vec::new();
    for file in manifests() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let mut lines = text.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if let Some(image) = line.strip_prefix("image:") {
                images.push((name.clone(), image.trim().to_owned()));
            }
            if line == "args:" {
                let first = lines.next().unwrap_or_default();
                let program = first.strip_prefix("- ").unwrap_or(first);
                programs.push((name.clone(), program.to_owned()));
            }
        }
    }
    (images, programs)
}

/// Runs `scripts/build-image` with `args` and only `path` as its PATH (as bash, so that no
/// lookup of bash itself depends on that PATH).
fn build_image(args: &[&str], path: &std::path::Path) -> std::process::Output {
    Command::new("/bin/bash")
        .arg(repo().join("scripts/build-image"))
        .args(args)
        .env("PATH", path)
        .output()
        .expect("run scripts/build-image")
}

/// The manifests name exactly the image `scripts/build-image` builds (`tollgate/tollgate:` and
/// the workspace's version), and the script builds it with the first engine it finds —
/// buildah, podman, then docker — or says in one line what to install. Engines are stand-ins
/// here that record their arguments: this machine has no container engine to build with.
#[test]
fn the_manifests_name_the_image_the_build_script_tags() {
    let empty = tempfile::tempdir().unwrap();
    let printed = build_image(&["--print-image"], empty.path());
    assert!(printed.status.success(), "{printed:?}");
    let image = String::from_utf8(printed.stdout).unwrap().trim().to_owned();
    assert_eq!(
        image,
        format!("tollgate/tollgate:{}", env!("CARGO_PKG_VERSION"))
    );

    let (images, _) = manifest_images_and_programs();
    assert_eq!(
        images,
        [
            ("authority.yaml".to_owned(), image.clone()),
            ("supervisor.yaml".to_owned(), image.clone())
        ],
        "every container runs the image the script builds"
    );

    let root = repo().canonicalize().unwrap();
    let expected = format!(
        "build --file {}/deploy/Containerfile --tag {image} {}",
        root.display(),
        root.display()
    );
    for (installed, chosen) in [
        (&["buildah", "podman", "docker"][..], "buildah"),
        (&["podman", "docker"][..], "podman"),
        (&["docker"][..], "docker"),
    ] {
        let bin = tempfile::tempdir().unwrap();
        let said = bin.path().join("said");
        for engine in installed {
            let fake = bin.path().join(engine);
            std::fs::write(
                &fake,
                format!(
                    "#!/bin/sh\nprintf '%s %s' {engine} \"$*\" > {}\n",
                    said.display()
                ),
            )
            .unwrap();
            let mut permissions = std::fs::metadata(&fake).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
            std::fs::set_permissions(&fake, permissions).unwrap();
        }
        let built = build_image(&[], bin.path());
        assert!(built.status.success(), "{built:?}");
        assert_eq!(
            std::fs::read_to_string(&said).unwrap(),
            format!("{chosen} {expected}"),
            "with {installed:?} installed"
        );
    }

    let none = build_image(&[], empty.path());
    let stderr = String::from_utf8_lossy(&none.stderr);
    assert_eq!(none.status.code(), Some(127), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("install buildah"), "{stderr}");
}

/// The image holds the four binaries and nothing else of the build: its last stage copies
/// exactly them from the build stage onto PATH (which builds exactly them), has no
/// entrypoint (each manifest's args start with one of them), and runs as a non-root user by
/// default — the authority's — while the supervisor's manifest asks for root.
#[test]
fn the_image_holds_the_four_binaries_and_nothing_else() {
    let instructions = containerfile();
    let stages: Vec<usize> = instructions
        .iter()
        .enumerate()
        .filter(|(_, (keyword, _))| keyword == "FROM")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        stages.len(),
        2,
        "a build stage and the image: {instructions:?}"
    );
    assert!(
        instructions[stages[0]].1.ends_with(" AS build"),
        "{instructions:?}"
    );
    let build = &instructions[stages[0]..stages[1]];
    let last = &instructions[stages[1]..];

    let cargo: Vec<_> = build
        .iter()
        .filter(|(keyword, rest)| keyword == "RUN" && rest.starts_with("cargo build"))
        .collect();
    assert_eq!(cargo.len(), 1, "{build:?}");
    let built: Vec<_> = cargo[0]
        .1
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|pair| pair[0] == "--bin")
        .map(|pair| pair[1])
        .collect();
    assert_eq!(built, IMAGE_BINARIES, "the build stage builds the four");
    assert!(cargo[0].1.contains("--release"), "{:?}", cargo[0]);

    let copies: Vec<_> = last
        .iter()
        .filter(|(keyword, _)| keyword == "COPY" || keyword == "ADD")
        .collect();
    assert_eq!(copies.len(), 1, "the image takes one thing in: {last:?}");
    let words: Vec<_> = copies[0].1.split_whitespace().collect();
    assert_eq!(words[0], "--from=build", "{copies:?}");
    let (destination, sources) = words[1..].split_last().unwrap();
    assert_eq!(*destination, "/usr/local/bin/");
    let expected: Vec<_> = IMAGE_BINARIES
        .iter()
        .map(|bin| format!("/src/target/release/{bin}"))
        .collect();
    assert_eq!(sources, expected, "exactly the four binaries");

    assert!(
        instructions
            .iter()
            .all(|(keyword, _)| keyword != "ENTRYPOINT"),
        "the manifests' args name the program: {instructions:?}"
    );
    let (_, programs) = manifest_images_and_programs();
    assert_eq!(
        programs,
        [
            ("authority.yaml".to_owned(), "tollgate-authority".to_owned()),
            (
                "supervisor.yaml".to_owned(),
                "tollgate-supervisor".to_owned()
            )
        ]
    );

    let users: Vec<_> = last
        .iter()
        .filter(|(keyword, _)| keyword == "USER")
        .collect();
    assert_eq!(users.len(), 1, "{last:?}");
    assert_eq!(users[0].1, "10001:10001", "non-root by default");
    let authority =
        std::fs::read_to_string(repo().join("deploy/kubernetes/authority.yaml")).unwrap();
    assert!(authority.contains("runAsNonRoot: true"), "{authority}");
    assert!(authority.contains("runAsUser: 10001"), "{authority}");
    let supervisor =
        std::fs::read_to_string(repo().join("deploy/kubernetes/supervisor.yaml")).unwrap();
    assert!(supervisor.contains("runAsUser: 0"), "{supervisor}");
}
