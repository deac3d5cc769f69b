//! `ToolCatalog`: a snapshot of the tools a turn may call — their specs, which worker pools serve
//! each tool, which pools run which subagent types. A turn takes one snapshot and the model sees
//! exactly its tools for that turn; routing picks a pool that provides the called tool, or runs
//! the spawned agent's type.
//!
//! Snapshots come from a `seams::ToolDirectory` (the live worker registry on a cluster, a fixed
//! list in memory).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::agent::model::ToolList;
use crate::protocol::{validate_token, ToolSpec, WorkerAnnouncement};

/// Tools and subagent capacity, as announced by workers.
#[derive(Debug, Default)]
pub struct ToolCatalog {
    tools: BTreeMap<String, (ToolSpec, Vec<String>)>,
    subagent_pools: Vec<SubagentPool>,
    /// Tool lists already handed out, by what they were asked for (see [`Self::tools_for`]).
    handed_out: Mutex<HashMap<String, ToolList>>,
}

/// A pool whose workers run subagents, and which types.
#[derive(Debug)]
struct SubagentPool {
    pool: String,
    /// The types its workers list; `None` when one of them runs every type.
    types: Option<BTreeSet<String>>,
}

impl SubagentPool {
    fn runs(&self, agent: &str) -> bool {
        self.types
            .as_ref()
            .is_none_or(|types| types.contains(agent))
    }
}

/// Most distinct tool lists one catalog keeps for sharing; beyond it, lists are built per turn.
const MAX_SHARED_TOOL_LISTS: usize = 64;

/// Spreads calls over pools across turns and catalog snapshots.
static NEXT_POOL: AtomicUsize = AtomicUsize::new(0);

impl ToolCatalog {
    /// Builds the catalog from live workers' announcements.
    pub fn from_workers(workers: &[WorkerAnnouncement]) -> Self {
        let mut tools: BTreeMap<String, (ToolSpec, Vec<String>)> = BTreeMap::new();
        let mut subagent_pools: Vec<SubagentPool> = Vec::new();
        for worker in workers {
            // Names end up in subjects: an announcement that would inject a level or a wildcard is
            // ignored rather than trusted.
            if validate_token("pool", &worker.pool).is_err() {
                tracing::warn!(worker_id = %worker.worker_id, "worker with an invalid pool name ignored");
                continue;
            }
            for spec in &worker.tools {
                if validate_token("tool", &spec.name).is_err() {
                    tracing::warn!(worker_id = %worker.worker_id, tool = %spec.name, "invalid tool name ignored");
                    continue;
                }
                let entry = tools
                    .entry(spec.name.clone())
                    .or_insert_with(|| (spec.clone(), Vec::new()));
                if !entry.1.contains(&worker.pool) {
                    entry.1.push(worker.pool.clone());
                }
            }
            if worker.runs_subagents {
                // Names end up in subjects too: an invalid type is ignored.
                let types = worker.agent_types.as_ref().map(|types| {
                    types
                        .iter()
                        .filter(|t| validate_token("agent", t).is_ok())
                        .cloned()
                        .collect::<BTreeSet<_>>()
                });
                match subagent_pools.iter_mut().find(|p| p.pool == worker.pool) {
                    None => subagent_pools.push(SubagentPool {
                        pool: worker.pool.clone(),
                        types,
                    }),
                    // Workers of one pool should agree; a pool with one that runs every type
                    // runs every type, else the types any of them lists.
                    Some(known) => match (&mut known.types, types) {
                        (Some(known), Some(types)) => known.extend(types),
                        (known, _) => *known = None,
                    },
                }
            }
        }
        Self {
            tools,
            subagent_pools,
            handed_out: Mutex::default(),
        }
    }

    /// A catalog of fixed tools served by one pool (in-memory runtimes, tests).
    pub fn from_specs(pool: &str, specs: Vec<ToolSpec>, runs_subagents: bool) -> Self {
        Self::from_workers(&[WorkerAnnouncement {
            v: crate::protocol::PROTOCOL_VERSION,
            worker_id: pool.to_owned(),
            pool: pool.to_owned(),
            version: crate::VERSION.to_owned(),
            tools: specs,
            runs_subagents,
            agent_types: None,
            capacity: 1,
            heartbeat_ms: 0,
            heartbeat_every_ms: 0,
        }])
    }

    /// The spec of a tool, if some pool provides it.
    pub fn spec(&self, tool: &str) -> Option<&ToolSpec> {
        self.tools.get(tool).map(|(spec, _)| spec)
    }

    /// The tools an allowlist permits (as [`Self::specs_allowed`]), plus `extras` last (the
    /// runtime's own tools, which `extras_key` names: the same key, the same extras): one shared
    /// list for every turn that asks for the same, so a turn holds no copy of the specs.
    pub fn tools_for(
        &self,
        allowlist: &[String],
        extras_key: &str,
        extras: &[ToolSpec],
    ) -> ToolList {
        let key = format!("{allowlist:?}|{extras_key}");
        if let Some(list) = self
            .handed_out
            .lock()
            .ok()
            .and_then(|h| h.get(&key).cloned())
        {
            return list;
        }
        let mut specs = self.specs_allowed(allowlist);
        specs.extend_from_slice(extras);
        let list = ToolList::from(specs);
        if let Ok(mut handed_out) = self.handed_out.lock() {
            if handed_out.len() < MAX_SHARED_TOOL_LISTS {
                handed_out.insert(key, list.clone());
            }
        }
        list
    }

    /// Specs of the tools an allowlist permits (`*` permits all), sorted by name.
    pub fn specs_allowed(&self, allowlist: &[String]) -> Vec<ToolSpec> {
        let all = allowlist.iter().any(|t| t == "*");
        self.tools
            .values()
            .filter(|(spec, _)| all || allowlist.contains(&spec.name))
            .map(|(spec, _)| spec.clone())
            .collect()
    }

    /// A pool that provides `tool`, spreading calls over pools.
    pub fn pool_for_tool(&self, tool: &str) -> Option<&str> {
        let pools = &self.tools.get(tool)?.1;
        pick(pools.len()).map(|i| pools[i].as_str())
    }

    /// A pool whose workers run subagents of type `agent`, spreading calls over pools.
    pub fn pool_for_subagent(&self, agent: &str) -> Option<&str> {
        let pools: Vec<&str> = self
            .subagent_pools
            .iter()
            .filter(|p| p.runs(agent))
            .map(|p| p.pool.as_str())
            .collect();
        pick(pools.len()).map(|i| pools[i])
    }
}

/// Which of `len` pools takes the next call (`None` when there are none).
fn pick(len: usize) -> Option<usize> {
    (len > 0).then(|| NEXT_POOL.fetch_add(1, Ordering::Relaxed) % len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn worker(id: &str, pool: &str, tools: &[&str], subagents: bool) -> WorkerAnnouncement {
        WorkerAnnouncement {
            v: 1,
            worker_id: id.into(),
            pool: pool.into(),
            version: "0".into(),
            tools: tools
                .iter()
                .map(|t| ToolSpec {
                    name: t.to_string(),
                    description: String::new(),
                    parameters: json!({}),
                    concurrency_safe: true,
                    effects: Default::default(),
                })
                .collect(),
            runs_subagents: subagents,
            agent_types: None,
            capacity: 1,
            heartbeat_ms: 0,
            heartbeat_every_ms: 1000,
        }
    }

    #[test]
    fn routes_tools_to_pools_that_provide_them() {
        let catalog = ToolCatalog::from_workers(&[
            worker("w1", "files", &["read_file"], false),
            worker("w2", "web", &["http_fetch"], true),
            worker("w3", "web", &["http_fetch"], true),
        ]);
        assert_eq!(catalog.pool_for_tool("read_file"), Some("files"));
        assert_eq!(catalog.pool_for_tool("http_fetch"), Some("web"));
        assert_eq!(catalog.pool_for_tool("nope"), None);
        assert_eq!(catalog.pool_for_subagent("researcher"), Some("web"));
    }

    #[test]
    fn routes_subagents_to_pools_that_run_their_type() {
        let listing = |id: &str, pool: &str, types: &[&str]| WorkerAnnouncement {
            agent_types: Some(types.iter().map(|t| t.to_string()).collect()),
            ..worker(id, pool, &[], true)
        };
        let catalog = ToolCatalog::from_workers(&[
            listing("w1", "research", &["researcher"]),
            listing("w2", "writing", &["writer", "bad.type"]),
            listing("w3", "writing", &["editor"]),
            worker("w4", "tools", &["read_file"], false),
        ]);
        assert_eq!(catalog.pool_for_subagent("researcher"), Some("research"));
        assert_eq!(catalog.pool_for_subagent("writer"), Some("writing"));
        assert_eq!(catalog.pool_for_subagent("editor"), Some("writing"));
        assert_eq!(catalog.pool_for_subagent("bad.type"), None);
        assert_eq!(catalog.pool_for_subagent("planner"), None);

        // A pool with a worker of every type runs every type, alongside the listing pools.
        let catalog = ToolCatalog::from_workers(&[
            listing("w1", "research", &["researcher"]),
            worker("w2", "any", &[], true),
        ]);
        assert_eq!(catalog.pool_for_subagent("planner"), Some("any"));
        let picked: BTreeSet<_> = (0..4)
            .filter_map(|_| catalog.pool_for_subagent("researcher"))
            .collect();
        assert_eq!(picked, BTreeSet::from(["any", "research"]));
    }

    #[test]
    fn names_that_would_break_subjects_are_ignored() {
        let catalog = ToolCatalog::from_workers(&[
            worker("w1", "p", &["ok", "x.>", "a b"], false),
            worker("w2", "bad.pool", &["other"], true),
        ]);
        assert_eq!(catalog.pool_for_tool("ok"), Some("p"));
        assert_eq!(catalog.pool_for_tool("x.>"), None);
        assert_eq!(catalog.pool_for_tool("other"), None);
        assert_eq!(catalog.pool_for_subagent("researcher"), None);
    }

    #[test]
    fn allowlist_filters_specs() {
        let catalog = ToolCatalog::from_workers(&[worker("w1", "p", &["a", "b"], false)]);
        let names = |specs: Vec<ToolSpec>| specs.into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(catalog.specs_allowed(&["*".into()])), ["a", "b"]);
        assert_eq!(
            names(catalog.specs_allowed(&["b".into(), "zz".into()])),
            ["b"]
        );
        assert!(catalog.specs_allowed(&[]).is_empty());
    }

    #[test]
    fn turns_asking_for_the_same_tools_share_one_list() {
        let catalog = ToolCatalog::from_workers(&[worker("w1", "p", &["a", "b"], false)]);
        let all = ["*".to_owned()];
        let first = catalog.tools_for(&all, "", &[]);
        let second = catalog.tools_for(&all, "", &[]);
        assert!(first.shares_specs_with(&second));
        assert_eq!(
            first.upper_bound(),
            crate::agent::tokens::tools_upper_bound(&first)
        );
        let names = |list: &[ToolSpec]| list.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&first), ["a", "b"]);

        let extra = ToolSpec {
            name: "spawn".into(),
            description: String::new(),
            parameters: json!({}),
            concurrency_safe: true,
            effects: Default::default(),
        };
        let with_extra =
            catalog.tools_for(&["b".to_owned()], "spawn", std::slice::from_ref(&extra));
        assert_eq!(names(&with_extra), ["b", "spawn"]);
        assert!(with_extra.shares_specs_with(&catalog.tools_for(
            &["b".to_owned()],
            "spawn",
            &[extra]
        )));
        assert!(!first.shares_specs_with(&with_extra));
    }
}
