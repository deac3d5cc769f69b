//! Skills, disclosed progressively, on a real cluster: the prompt lists the catalog, `load_skill`
//! returns a skill's body and copies its resource files into the session's workspace, a loaded
//! skill is session state, and a subagent on a worker loads only the skills its definition allows
//! (they travel with its task: the worker has no agents folder).

use serde_json::json;
use skein_common::protocol::{child_session_id, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::unique;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_load_on_demand_stay_loaded_and_reach_subagents_as_allowed() {
    let cluster = TestCluster::start();
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    std::fs::create_dir_all(agents.join("skills/notes")).expect("skill dir");
    std::fs::create_dir_all(agents.join("skills/secret")).expect("skill dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\n[permissions]\nmode = \"accept_edits\"\n+++\nYou delegate.\n",
    )
    .expect("AGENTS.md");
    std::fs::write(
        agents.join("subagents/helper.md"),
        "+++\ndescription = \"helps\"\nskills = [\"notes\"]\n+++\nYou help.\n",
    )
    .expect("helper.md");
    std::fs::write(
        agents.join("skills/notes/SKILL.md"),
        "+++\ndescription = \"how to keep notes\"\n+++\nWrite one line per fact.\n",
    )
    .expect("notes skill");
    std::fs::write(agents.join("skills/notes/template.md"), "# Notes\n").expect("resource");
    std::fs::write(
        agents.join("skills/secret/SKILL.md"),
        "+++\ndescription = \"not for helpers\"\n+++\nThe secret recipe.\n",
    )
    .expect("secret skill");
    let scenario = cluster.dir.join(unique("scenario")).with_extension("json");
    let script = json!({ "agents": {
        "assistant": { "turns": [
            { "steps": [
                { "tool_calls": [ { "name": "load_skill", "arguments": { "name": "notes" } } ] },
                { "tool_calls": [ { "name": "spawn_agent", "arguments": { "agent": "helper", "task": "use your skills" } } ] },
                { "answer": "{{observations}}" }
            ] },
            { "steps": [ { "answer": "second turn" } ] }
        ] },
        "helper": { "turns": [ { "steps": [
            { "tool_calls": [
                { "name": "load_skill", "arguments": { "name": "notes" } },
                { "name": "load_skill", "arguments": { "name": "secret" } }
            ] },
            { "answer": "helper: {{observations}}" }
        ] } ] }
    } });
    std::fs::write(&scenario, script.to_string()).expect("scenario");
    // The worker runs the helper's loop with the same scripted model.
    cluster.spawn_worker(
        cluster.worker_config(&["--scenario", scenario.to_str().expect("utf-8 path")]),
    );
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--scenario",
        scenario.to_str().expect("utf-8 path"),
        "--agents-dir",
        agents.to_str().expect("utf-8 path"),
    ]));

    let session = unique("s");
    let first = submission("acme", &session, "take notes");
    let (result, _) = cluster.run(&first).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    // The helper loaded the skill it may use and was refused the other one.
    assert!(
        answer.contains("helper: Write one line per fact."),
        "{answer}"
    );
    assert!(
        answer.contains("unknown skill \\\"secret\\\"")
            || answer.contains("unknown skill \"secret\""),
        "{answer}"
    );
    assert!(answer.contains("available: notes"), "{answer}");

    // The resource file is in the session's workspace, where the workspace tools read it.
    assert_eq!(
        cluster
            .workspace_file("acme", &session, "skills/notes/template.md")
            .await
            .as_deref(),
        Some("# Notes\n")
    );

    // Loaded skills are session state: the lead's session and the helper's child session.
    let store = cluster.store().await;
    let state = store.load("acme", &session).await.expect("session").state;
    assert_eq!(state.skills, ["notes"]);
    let children: Vec<String> = state
        .history
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .filter(|c| c.name == "spawn_agent")
        .map(|c| child_session_id(&session, &c.id))
        .collect();
    assert_eq!(children.len(), 1);
    let child = store.load("acme", &children[0]).await.expect("child").state;
    assert_eq!(
        child.skills,
        ["notes"],
        "the helper loaded only what it may"
    );

    // A later turn keeps them.
    let (second, _) = cluster.run(&submission("acme", &session, "again")).await;
    assert_eq!(second.status, TurnStatus::Completed);
    let state = store.load("acme", &session).await.expect("session").state;
    assert_eq!(state.skills, ["notes"]);
    assert_eq!(state.turns, 2);
}
