//! Earlier versions of workspace files, kept so that a fork gets a session's files as they were
//! at its point (a turn's end, or a step's), not as they are now.
//!
//! When a write or a removal replaces a file's current metadata (which keeps one message per
//! name), the replaced message — a version, or the mark of a removal — is appended to the
//! metadata of a second name, `~history/<session>/<path>` (not a workspace path: listings and
//! tools never see it), and its chunks stay. Each such entry carries its place in the name's
//! history (`skein-ordinal`, 1 for the first); once a name keeps more than
//! `SKEIN_WORKSPACE_VERSIONS` entries, the oldest are dropped with their chunks. Every current
//! version also names the version it replaced (`skein-replaces`; empty for a name's first), so a
//! gap — a dropped entry, an append that failed, a version written before history was kept — is
//! seen, never papered over; and when its name first held a file (`skein-born`), which survives
//! the dropping of old entries.
//!
//! A file's version at instant `t` is the one with the latest `modified` at or before `t`, when
//! its successor (the next version known) names it as the one it replaced; a name born after `t`
//! had no file at `t`. Anything else is unknown, and a caller asking for it gets the paths it
//! cannot serve. `modified` is the writer's clock; a turn's end is
//! the lead's: a model call lies between a step's last write and the next step's first, so clocks
//! in step within a fraction of that give the right version.

use std::collections::BTreeMap;

use async_nats::jetstream::object_store::ObjectInfo;

use super::bucket::{Bucket, Meta};
use crate::workspace::WorkspaceError;

/// Names of the kept versions start with this and the file's object name.
pub(super) const HISTORY_PREFIX: &str = "~history/";
/// Metadata of a current version: the `nuid` of the version it replaced (empty: none).
const REPLACES: &str = "skein-replaces";
/// Metadata of a current version: when its name first held a file (Unix nanoseconds).
const BORN: &str = "skein-born";
/// Metadata of a kept version: its place in its name's history, from 1.
const ORDINAL: &str = "skein-ordinal";
/// Oldest entries one append drops at most (more are dropped by later appends).
const TRIM_PER_APPEND: usize = 8;

/// The name a file's kept versions are appended to.
pub(super) fn history_name(object: &str) -> String {
    format!("{HISTORY_PREFIX}{object}")
}

/// Marks `info`, about to become its name's current metadata, as replacing `replaced` (`None`:
/// the name's first version).
pub(super) fn mark_replacing(info: &mut ObjectInfo, replaced: Option<&ObjectInfo>) {
    let nuid = replaced.map_or_else(String::new, |r| r.nuid.clone());
    info.metadata.insert(REPLACES.to_owned(), nuid);
    let born = match replaced {
        None => Some(modified_nanos(info).to_string()),
        // A name written before births were kept has none.
        Some(replaced) => replaced.metadata.get(BORN).cloned(),
    };
    match born {
        Some(born) => info.metadata.insert(BORN.to_owned(), born),
        None => info.metadata.remove(BORN),
    };
}

/// Keeps `replaced` (the metadata a write or removal of its name just replaced) as the newest
/// entry of the name's history, and drops the entries beyond `keep`, with their chunks. A failure
/// leaves a gap the history reports; the write it follows stands.
pub(super) async fn keep_replaced(bucket: &Bucket, replaced: Meta, keep: usize) {
    let name = history_name(&replaced.info.name);
    let kept = async {
        let last = bucket.meta(&name).await?;
        let ordinal = last.as_ref().map_or(0, |m| ordinal_of(&m.info)) + 1;
        let mut entry = replaced.info;
        entry.name.clone_from(&name);
        entry
            .metadata
            .insert(ORDINAL.to_owned(), ordinal.to_string());
        bucket.append_meta(&entry).await?;
        let oldest_kept = ordinal.saturating_sub(keep as u64) + 1;
        for _ in 0..TRIM_PER_APPEND {
            let Some(first) = bucket.first_meta(&name).await? else {
                break;
            };
            if ordinal_of(&first.info) >= oldest_kept {
                break;
            }
            bucket.delete_message(first.seq).await?;
            if !first.info.deleted {
                bucket.purge_chunks(&first.info.nuid).await;
            }
        }
        Ok::<_, WorkspaceError>(())
    };
    if let Err(e) = kept.await {
        tracing::warn!(bucket = %bucket.name, object = %name, error = %e, "an earlier version was not kept; forks to before it cannot have it");
    }
}

fn ordinal_of(info: &ObjectInfo) -> u64 {
    info.metadata
        .get(ORDINAL)
        .and_then(|o| o.parse().ok())
        .unwrap_or(0)
}

/// Every known version of each file of a session, from the bucket's metadata messages.
#[derive(Debug, Default)]
pub(super) struct SessionVersions {
    by_path: BTreeMap<String, Vec<ObjectInfo>>,
}

impl SessionVersions {
    /// The versions of `session`'s files among `messages` (every metadata message of a bucket),
    /// keyed by path; `path_of` says whether a name below the session is a workspace path.
    pub fn collect(
        session: &str,
        messages: Vec<ObjectInfo>,
        is_path: impl Fn(&str) -> bool,
    ) -> Self {
        let current_prefix = format!("{session}/");
        let kept_prefix = history_name(&current_prefix);
        let mut by_path: BTreeMap<String, Vec<ObjectInfo>> = BTreeMap::new();
        for info in messages {
            let path = info
                .name
                .strip_prefix(&kept_prefix)
                .or_else(|| info.name.strip_prefix(&current_prefix));
            let Some(path) = path.filter(|p| is_path(p)) else {
                continue;
            };
            by_path.entry(path.to_owned()).or_default().push(info);
        }
        Self { by_path }
    }

    /// What each path held at `at_nanos` (Unix time): the files that existed then, and the paths
    /// whose version then is not known (its history no longer reaches that far, or has a gap).
    pub fn at(self, at_nanos: i128) -> (Vec<(String, ObjectInfo)>, Vec<String>) {
        let mut files = Vec::new();
        let mut unknown = Vec::new();
        for (path, versions) in self.by_path {
            match version_at(versions, at_nanos) {
                Ok(Some(info)) => files.push((path, info)),
                Ok(None) => {}
                Err(()) => unknown.push(path),
            }
        }
        (files, unknown)
    }
}

fn modified_nanos(info: &ObjectInfo) -> i128 {
    info.modified.map_or(0, |m| m.unix_timestamp_nanos())
}

/// The version of one name at `at_nanos` among its known versions: `Ok(None)` when no file was
/// there, `Err` when it cannot be known.
fn version_at(mut versions: Vec<ObjectInfo>, at_nanos: i128) -> Result<Option<ObjectInfo>, ()> {
    versions.sort_by_key(modified_nanos);
    versions
        .dedup_by(|a, b| a.nuid == b.nuid && a.deleted == b.deleted && a.modified == b.modified);
    let born = versions
        .iter()
        .find_map(|v| v.metadata.get(BORN)?.parse::<i128>().ok());
    if born.is_some_and(|born| at_nanos < born) {
        return Ok(None);
    }
    let replaces = |info: &ObjectInfo| info.metadata.get(REPLACES).cloned();
    let Some(index) = versions.iter().rposition(|v| modified_nanos(v) <= at_nanos) else {
        // Every known version came later: no file then if the first of them was the first ever.
        return match versions.first().map(replaces) {
            Some(Some(replaced)) if replaced.is_empty() => Ok(None),
            _ => Err(()),
        };
    };
    if let Some(next) = versions.get(index + 1) {
        if replaces(next).as_deref() != Some(versions[index].nuid.as_str()) {
            return Err(());
        }
    }
    let version = versions.swap_remove(index);
    Ok((!version.deleted).then_some(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i128 = 1_000_000_000;

    fn version(nuid: &str, at_s: i128, replaces: Option<&str>, deleted: bool) -> ObjectInfo {
        let mut info: ObjectInfo = serde_json::from_value(serde_json::json!({
            "name": "s/a.txt", "bucket": "b", "nuid": nuid, "size": 1, "chunks": 1,
            "deleted": deleted,
        }))
        .expect("object info");
        info.modified = Some(async_nats::datetime::from_nanos(at_s * SECOND).expect("a time"));
        if let Some(replaced) = replaces {
            info.metadata.insert(REPLACES.into(), replaced.into());
        }
        info
    }

    fn nuid_at(versions: &[ObjectInfo], at_s: i128) -> Result<Option<String>, ()> {
        version_at(versions.to_vec(), at_s * SECOND).map(|v| v.map(|v| v.nuid))
    }

    #[test]
    fn a_files_version_at_an_instant_is_the_last_written_before_it() {
        let versions = [
            version("v1", 10, Some(""), false),
            version("gone", 20, Some("v1"), true),
            version("v3", 30, Some("gone"), false),
        ];
        assert_eq!(nuid_at(&versions, 5), Ok(None), "not created yet");
        assert_eq!(nuid_at(&versions, 10), Ok(Some("v1".into())));
        assert_eq!(nuid_at(&versions, 25), Ok(None), "removed then");
        assert_eq!(nuid_at(&versions, 40), Ok(Some("v3".into())));
        // The removal's mark was not kept: when v1 ended is not known, so neither is anything
        // before v3 (never v1 inside the removal).
        let lost_mark = [versions[0].clone(), versions[2].clone()];
        assert_eq!(nuid_at(&lost_mark, 25), Err(()));
        assert_eq!(nuid_at(&lost_mark, 15), Err(()));
        assert_eq!(nuid_at(&lost_mark, 35), Ok(Some("v3".into())));
    }

    #[test]
    fn a_history_with_a_gap_or_a_lost_start_is_not_guessed_over() {
        // v2 was dropped: at 25 the file held v2, which is not known.
        let gap = [
            version("v1", 10, Some(""), false),
            version("v3", 30, Some("v2"), false),
        ];
        assert_eq!(nuid_at(&gap, 25), Err(()));
        assert_eq!(nuid_at(&gap, 35), Ok(Some("v3".into())));
        // The oldest kept version replaced one that is gone: before it, unknown, except before
        // the name first held a file.
        let mut trimmed = version("v5", 50, Some("v4"), false);
        assert_eq!(nuid_at(&[trimmed.clone()], 40), Err(()));
        trimmed
            .metadata
            .insert(BORN.into(), (30 * SECOND).to_string());
        assert_eq!(nuid_at(&[trimmed.clone()], 20), Ok(None));
        assert_eq!(nuid_at(&[trimmed], 40), Err(()));
        // Written before versions were kept: the current one is still known from its time on.
        let untracked = [version("v9", 90, None, false)];
        assert_eq!(nuid_at(&untracked, 95), Ok(Some("v9".into())));
        assert_eq!(nuid_at(&untracked, 80), Err(()));
    }

    #[test]
    fn kept_and_current_versions_are_found_by_their_session_and_path() {
        let mut kept = version("v1", 10, Some(""), false);
        kept.name = history_name("s/a.txt");
        let current = version("v2", 20, Some("v1"), false);
        let mut other_session = version("x", 10, Some(""), false);
        other_session.name = "s2/a.txt".into();
        let mut hidden = version("y", 10, Some(""), false);
        hidden.name = "s/bad".into();
        let versions =
            SessionVersions::collect("s", vec![kept, current, other_session, hidden], |p| {
                p != "bad"
            });
        let (files, unknown) = versions.at(15 * SECOND);
        assert!(unknown.is_empty());
        assert_eq!(files.len(), 1);
        assert_eq!(
            (files[0].0.as_str(), files[0].1.nuid.as_str()),
            ("a.txt", "v1")
        );
    }
}
