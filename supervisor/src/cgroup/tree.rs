//! The runs' parent cgroup as a tree: where each sandbox's cgroup goes under it, and the
//! sweep that removes what was left there.
//!
//! Sandboxes are not the parent's direct children. Each goes into one of [`SHARDS`]
//! intermediate cgroups, chosen by its id: `<parent>/shard-NN/sandbox-<uuid>`. Why: for each
//! CPU the kernel keeps a singly linked list of a cgroup's children whose statistics changed,
//! and a child's release unlinks itself by walking its parent's list from the head, with
//! interrupts off and under the kernel's one cgroup mutex (`css_rstat_flush` in
//! `css_release_work_fn`). With every sandbox a child of the parent, ending N runs made N
//! walks of up to N siblings, in each of a run's hierarchies: at 5,000 live runs, an eighth of
//! a stop's CPU time, with the mutex held meanwhile. Spread over 16 shards, a walk is about
//! N/16 long at most.
//!
//! The shards are made when the supervisor opens ([`make_shards`]), not by the first runs
//! that need them: on a host that has held thousands of sandboxes, making one memory cgroup
//! costs over a millisecond (the kernel sizes each one's shrinker slots by the most file
//! systems the host ever had at once), which a cold start would pay. They stay while the
//! supervisor runs; a clean stop removes them ([`remove_shards`]).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    delegate_to, remove_with_retries, v1_mount, CgroupError, CgroupMode, RunCgroup, HYBRID_V2_ROOT,
    SUPERVISOR_LEAF, UNIFIED_ROOT, V1_CONTROLLERS,
};

/// How many shards a parent's sandboxes are spread over: enough that a shard's list stays
/// short (about 300 at 5,000 live runs, against 5,000), few enough that making them all when
/// the supervisor opens costs little.
pub const SHARDS: u32 = 16;

/// What a shard's name starts with; two hex digits follow.
const SHARD_PREFIX: &str = "shard-";

/// The cgroup (relative to each hierarchy's root) of sandbox `sandbox_id` under `parent`:
/// `<parent>/shard-NN/<sandbox_id>`.
pub fn sandbox_path(parent: &str, sandbox_id: &str) -> String {
    // FNV-1a over the whole id: any even spread will do, and a time-ordered id's tail is its
    // random part.
    let hash = sandbox_id.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    format!("{parent}/{}/{sandbox_id}", shard_name(hash % SHARDS))
}

/// The name of shard `index`.
fn shard_name(index: u32) -> String {
    format!("{SHARD_PREFIX}{index:02x}")
}

/// Makes every shard under `parent`, with `parent` where it is missing, in the hierarchies a
/// run's cgroup is in (no v1 freezer on a hybrid host whose v2 tree kills, as for runs; on v2
/// with the run controllers enabled for its children, as [`delegate_to`] does for the
/// parent). Shards already there are kept.
pub fn make_shards(parent: &str) -> Result<(), CgroupError> {
    let unified = CgroupMode::detect() == CgroupMode::Unified;
    (0..SHARDS).try_for_each(|index| {
        let shard = format!("{parent}/{}", shard_name(index));
        if unified {
            delegate_to(&shard)
        } else {
            RunCgroup::create_unlimited(&shard).map(drop)
        }
    })
}

/// Removes every shard under `parent` in every hierarchy; each must be empty (a clean stop's
/// last step, once every run's cgroup is gone).
pub fn remove_shards(parent: &str) -> Result<(), CgroupError> {
    for root in hierarchy_roots(&CgroupMode::detect()) {
        let dir = root.join(parent);
        for shard in subdirectories(&dir) {
            if is_shard(&shard) {
                remove_with_retries(&dir.join(&shard), Duration::from_secs(1))?;
            }
        }
    }
    Ok(())
}

/// Whether `name`, a directory directly under a parent, is a shard: not a sandbox's cgroup
/// (an older supervisor made those directly under the parent), nor the supervisor's own
/// leaf.
pub fn is_shard(name: &str) -> bool {
    name.strip_prefix(SHARD_PREFIX)
        .is_some_and(|digits| digits.len() == 2 && digits.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The root of every hierarchy a run's cgroup is in on a host of this mode.
fn hierarchy_roots(mode: &CgroupMode) -> Vec<PathBuf> {
    match mode {
        CgroupMode::Unified => vec![PathBuf::from(UNIFIED_ROOT)],
        CgroupMode::Legacy | CgroupMode::Hybrid => {
            let mut roots: Vec<PathBuf> = V1_CONTROLLERS
                .into_iter()
                .filter_map(|controller| v1_mount(controller).ok())
                .collect();
            if *mode == CgroupMode::Hybrid {
                roots.push(PathBuf::from(HYBRID_V2_ROOT));
            }
            roots
        }
    }
}

/// The names of the directories in `dir` (none when it does not exist).
fn subdirectories(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The sandbox cgroups under `parent` in any of `roots`, relative to `parent`
/// (`shard-NN/sandbox-…`, or `sandbox-…` as older supervisors made them).
fn sandboxes_in(roots: &[PathBuf], parent: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for root in roots {
        let dir = root.join(parent);
        for name in subdirectories(&dir) {
            if is_shard(&name) {
                for sandbox in subdirectories(&dir.join(&name)) {
                    found.insert(format!("{name}/{sandbox}"));
                }
            } else if name != SUPERVISOR_LEAF {
                found.insert(name);
            }
        }
    }
    found
}

/// The sandbox cgroups under `parent` in any hierarchy of this host, relative to `parent`
/// (`shard-NN/sandbox-…`), sorted.
pub fn sandbox_cgroups(parent: &str) -> Vec<String> {
    sandboxes_in(&hierarchy_roots(&CgroupMode::detect()), parent)
        .into_iter()
        .collect()
}

/// Removes every run cgroup under `parent` (e.g. `tollgate`) in every hierarchy, killing what
/// is inside first; then, when `remove_parent`, the shards and `parent` itself. Used at
/// start-up to sweep what a crashed supervisor left, and at a stop. Returns the cgroups
/// swept, relative to `parent`.
pub fn sweep(parent: &str, remove_parent: bool) -> Result<Vec<String>, CgroupError> {
    sweep_keeping(parent, remove_parent, &BTreeSet::new())
}

/// [`sweep`], leaving the run cgroups named in `keep` (runs a live restore re-adopted), and
/// the shards and the parent with them.
pub fn sweep_keeping(
    parent: &str,
    remove_parent: bool,
    keep: &BTreeSet<String>,
) -> Result<Vec<String>, CgroupError> {
    let roots = hierarchy_roots(&CgroupMode::detect());
    let swept: Vec<String> = sandboxes_in(&roots, parent)
        .into_iter()
        .filter(|relative| !keep.contains(relative.rsplit('/').next().unwrap_or_default()))
        .collect();
    for relative in &swept {
        let run = RunCgroup::existing(&format!("{parent}/{relative}"));
        run.kill_all(Duration::from_secs(5))?;
        run.remove()?;
    }
    if remove_parent && keep.is_empty() {
        remove_shards(parent)?;
        for root in &roots {
            remove_with_retries(&root.join(parent), Duration::from_secs(1))?;
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids spread over every shard, each id always to the same one, and the path names it.
    #[test]
    fn sandboxes_spread_over_every_shard_and_each_stays_in_its_own() {
        let mut shards = BTreeSet::new();
        for n in 0..2_000 {
            let id = format!(
                "sandbox-{:032x}",
                0x0190_0000_0000_7000_8000_0000_0000_0000_u128 + n
            );
            let path = sandbox_path("tollgate", &id);
            assert_eq!(path, sandbox_path("tollgate", &id));
            let (shard, rest) = path
                .strip_prefix("tollgate/")
                .and_then(|p| p.split_once('/'))
                .unwrap();
            assert_eq!(rest, id);
            assert!(is_shard(shard), "{shard}");
            shards.insert(shard.to_owned());
        }
        assert_eq!(shards.len(), SHARDS as usize);
    }

    #[test]
    fn only_shard_names_are_shards() {
        assert!(is_shard("shard-00"));
        assert!(is_shard("shard-3f"));
        assert!(!is_shard("shard-"));
        assert!(!is_shard("shard-3f0"));
        assert!(!is_shard("sandbox-0190"));
        assert!(!is_shard(SUPERVISOR_LEAF));
    }
}
