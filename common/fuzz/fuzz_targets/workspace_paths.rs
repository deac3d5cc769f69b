//! The workspace path resolver of the worker's file tools (`worker/src/tools/fs.rs`):
//! `Workspace::for_session` on the input as tenant and as session, and `resolve` of the input as
//! a path in a session directory seeded with files, directories and symbolic links that point
//! inside, up, into another session, to `/`, nowhere and at themselves.
//!
//! Checks: no panic; a session that `for_session` accepts is a directory exactly two levels
//! below the root; a path that resolves lies inside the canonical session directory, is not
//! itself a symbolic link, and the real location of its deepest existing part is inside too.

#![no_main]

use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use skein_common::protocol::TaskOrigin;
use skein_worker::tools::fs::Workspace;
use tokio::runtime::Runtime;

struct Harness {
    runtime: Runtime,
    root: PathBuf,
    workspace: Workspace,
    /// The session directory, canonicalized.
    session: PathBuf,
}

fn origin(tenant: &str, workspace: &str) -> TaskOrigin {
    TaskOrigin {
        task_id: "t".into(),
        tenant: tenant.into(),
        user: "u".into(),
        session: workspace.into(),
        workspace: workspace.into(),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    }
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let root =
            std::env::temp_dir().join(format!("skein-fuzz-workspaces-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let session = root.join("acme").join("s1");
        let peer = root.join("acme").join("s2");
        for dir in [session.join("notes"), session.join("deep/er"), peer.clone()] {
            std::fs::create_dir_all(dir).expect("a seeded directory");
        }
        for file in [
            session.join("notes/a.md"),
            session.join("file.txt"),
            session.join("deep/er/x.txt"),
            peer.join("secret.txt"),
        ] {
            std::fs::write(file, "x").expect("a seeded file");
        }
        let links: [(&str, &Path); 8] = [
            ("link_in", Path::new("notes")),
            ("link_in_abs", &session.join("notes")),
            ("link_up", Path::new("..")),
            ("link_peer", Path::new("../s2")),
            ("link_root", Path::new("/")),
            ("link_broken", Path::new("missing/nowhere")),
            ("link_loop", Path::new("link_loop")),
            ("notes/back", Path::new("../..")),
        ];
        for (name, target) in links {
            std::os::unix::fs::symlink(target, session.join(name)).expect("a seeded link");
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let workspace =
            Workspace::for_session(&root, &origin("acme", "s1")).expect("a valid session");
        let session = std::fs::canonicalize(&session).expect("the session directory resolves");
        Harness {
            runtime,
            root,
            workspace,
            session,
        }
    })
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let harness = harness();

    for (tenant, workspace) in [(text, "s1"), ("acme", text)] {
        if let Ok(accepted) = Workspace::for_session(&harness.root, &origin(tenant, workspace)) {
            let below = accepted
                .dir()
                .strip_prefix(&harness.root)
                .expect("below the root");
            let parts: Vec<_> = below.components().collect();
            assert!(
                parts.len() == 2 && parts.iter().all(|c| matches!(c, Component::Normal(_))),
                "{tenant:?}/{workspace:?} -> {below:?}"
            );
        }
    }

    let Ok(path) = harness.runtime.block_on(harness.workspace.resolve(text)) else {
        return;
    };
    assert!(path.starts_with(&harness.session), "{text:?} -> {path:?}");
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        assert!(
            !meta.file_type().is_symlink(),
            "{text:?} -> a link {path:?}"
        );
    }
    let deepest = path
        .ancestors()
        .find(|part| std::fs::symlink_metadata(part).is_ok())
        .expect("the session directory exists");
    let real = std::fs::canonicalize(deepest).expect("the deepest existing part resolves");
    assert!(
        real.starts_with(&harness.session),
        "{text:?} -> {path:?} is really {real:?}"
    );
});
