//! Structured answers through the whole cluster: a submission (or an agent definition) gives an
//! output JSON Schema; the model is asked for it the way its provider understands
//! (`response_format: json_schema` for an OpenAI-compatible server, a forced `final_answer` tool
//! for Anthropic); the answer is checked, an answer that does not match is repaired once (a second
//! model call, told what was wrong) and otherwise ends the task `invalid_output`; the final result
//! carries the parsed `output` beside the text. A schema the validator cannot check is refused.

use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use futures::StreamExt;
use serde_json::{json, Value};
use skein_common::client::ClientError;
use skein_common::protocol::{
    EventKind, FailureKind, FinalResult, OutputSchema, TaskSubmission, TurnStatus,
};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::fake_anthropic::{AnthropicReply, FakeAnthropic};
use skein_tests::support::{unique, FakeOpenAi, FakeReply};

const SKEIN: &str = env!("CARGO_BIN_EXE_skein-node");

/// A trip: where, and for how long (strict mode takes it as it is).
fn trip_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1},
        },
        "required": ["city", "days"],
        "additionalProperties": false,
    })
}

fn structured(tenant: &str, input: &str) -> TaskSubmission {
    TaskSubmission {
        output_schema: Some(Box::new(OutputSchema {
            name: "trip".into(),
            ..OutputSchema::new(trip_schema())
        })),
        ..submission(tenant, &unique("s"), input)
    }
}

fn discarded(events: &[skein_common::protocol::TurnEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.event {
            EventKind::OutputDiscarded { failure } => Some(failure.message.clone()),
            _ => None,
        })
        .collect()
}

/// The last message of a chat-completions request body.
fn last_message(body: &Value) -> &Value {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .expect("a request with messages")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_structured_answer_is_asked_as_a_response_format_and_comes_back_parsed() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer(r#"{"city": "Oslo", "days": 3}"#)]).await;
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;

    let task = structured("acme", "plan a trip");
    let (result, events) = cluster.run(&task).await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.output, Some(json!({"city": "Oslo", "days": 3})));
    assert_eq!(
        result.answer.as_deref(),
        Some(r#"{"city": "Oslo", "days": 3}"#)
    );
    assert_eq!(result.iterations, 1);
    assert!(discarded(&events).is_empty());

    let requests = model.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        requests[0]["response_format"],
        json!({"type": "json_schema", "json_schema": {
            "name": "trip",
            "schema": trip_schema(),
            "strict": true,
        }})
    );
    assert!(
        requests[0]["tools"].is_array(),
        "the worker's tools beside it"
    );

    // The stored result carries it too, and the session keeps the answer.
    let stored = cluster
        .client()
        .await
        .stored_final("acme", &task.session, &task.task_id)
        .await
        .expect("looked up")
        .expect("stored");
    assert_eq!(stored.output, result.output);
    let session = cluster
        .store()
        .await
        .load("acme", &task.session)
        .await
        .expect("the session loads");
    assert_eq!(
        session.state.history.last().map(|m| m.content.as_str()),
        Some(r#"{"city": "Oslo", "days": 3}"#)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_does_not_match_is_repaired_with_the_validation_errors() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::answer(r#"{"city": "Oslo"}"#),
        FakeReply::answer(r#"{"city": "Oslo", "days": 2}"#),
    ])
    .await;
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;

    let (result, events) = cluster.run(&structured("acme", "plan a trip")).await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.output, Some(json!({"city": "Oslo", "days": 2})));
    assert_eq!(result.iterations, 2, "the repair is a model call");
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    // The second request: the answer that failed, then what was wrong with it.
    let repair = last_message(&requests[1]);
    assert_eq!(repair["role"], json!("user"));
    let text = repair["content"].as_str().unwrap_or_default();
    assert!(
        text.contains("(root): the required property \"days\" is missing"),
        "{text}"
    );
    assert!(
        requests[1]["response_format"].is_object(),
        "asked again in the format"
    );
    // What the first answer streamed is taken back.
    let discarded = discarded(&events);
    assert_eq!(discarded.len(), 1, "{events:?}");
    assert!(
        discarded[0].contains("\"days\" is missing"),
        "{discarded:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_still_does_not_match_ends_invalid_output() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::answer("Oslo, for three days."),
        FakeReply::answer(r#"{"city": "Oslo", "days": "three"}"#),
        FakeReply::answer(r#"{"city": "Oslo", "days": 3}"#),
    ])
    .await;
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;

    let task = structured("acme", "plan a trip");
    let (result, _) = cluster.run(&task).await;

    assert_eq!(result.status, TurnStatus::InvalidOutput, "{result:?}");
    let failure = result.failure.clone().expect("a failure");
    assert_eq!(failure.kind, FailureKind::InvalidOutput);
    assert!(
        failure
            .message
            .contains("/days: expected integer, got string \"three\""),
        "{failure}"
    );
    assert!(
        failure.message.contains("after one repair attempt"),
        "{failure}"
    );
    assert_eq!(result.output, None);
    assert_eq!(
        result.answer.as_deref(),
        Some(r#"{"city": "Oslo", "days": "three"}"#),
        "the last answer, for the record"
    );
    assert_eq!(model.requests().len(), 2, "one repair, no more");
    assert_eq!(model.remaining(), 1);
    // The session is left as it was.
    let session = cluster
        .store()
        .await
        .load("acme", &task.session)
        .await
        .expect("the session loads");
    assert!(
        session.state.history.is_empty(),
        "{:?}",
        session.state.history
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_is_made_to_call_the_answer_tool_whose_input_is_the_output() {
    let cluster = TestCluster::start();
    let model = FakeAnthropic::start(vec![AnthropicReply::tools(vec![(
        "final_answer",
        json!({"city": "Bergen", "days": 4}),
    )])])
    .await;
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--model-provider",
        "anthropic",
        "--model-base-url",
        &model.base_url,
        "--model-api-key",
        "sk-ant-test-key",
        "--model",
        "claude-sonnet-4-5",
    ]));

    let (result, events) = cluster.run(&structured("acme", "plan a trip")).await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.output, Some(json!({"city": "Bergen", "days": 4})));
    assert_eq!(
        result
            .answer
            .as_deref()
            .map(|a| serde_json::from_str::<Value>(a).expect("the answer is JSON")),
        Some(json!({"city": "Bergen", "days": 4}))
    );
    // Nothing was dispatched: the tool's call is the answer.
    assert!(!events
        .iter()
        .any(|e| matches!(e.event, EventKind::ToolStarted { .. })));
    let streamed: String = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ModelDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(Some(streamed.as_str()), result.answer.as_deref());

    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    let body = &requests[0].body;
    let tools = body["tools"].as_array().expect("tools");
    let answer_tool = tools.last().expect("the answer tool comes last");
    assert_eq!(answer_tool["name"], json!("final_answer"));
    assert_eq!(answer_tool["input_schema"], trip_schema());
    assert!(tools.len() > 1, "the worker's tools too");
    assert_eq!(
        body["tool_choice"],
        json!({"type": "any"}),
        "a tool must be called"
    );
}

/// Writes an agents folder: `AGENTS.md`, `subagents/*.md` and other files, by relative path.
fn agents_folder(cluster: &TestCluster, files: &[(&str, &str)]) -> String {
    let dir = cluster.dir.join(unique("agents"));
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("folder created");
        std::fs::write(path, text).expect("file written");
    }
    dir.display().to_string()
}

fn scenario(cluster: &TestCluster, agents: Value) -> String {
    let path = cluster.dir.join(format!("{}.json", unique("scenario")));
    std::fs::write(&path, json!({ "agents": agents }).to_string()).expect("scenario written");
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_own_schema_holds_its_answers_on_the_lead_and_on_the_worker() {
    let cluster = TestCluster::start();
    let agents = agents_folder(
        &cluster,
        &[
            (
                "AGENTS.md",
                "+++\nsubagents = [\"extractor\"]\n\n[output_schema]\ntype = \"object\"\n\
                 required = [\"summary\"]\n[output_schema.properties.summary]\n\
                 type = \"string\"\n+++\nDelegate, then summarise.\n",
            ),
            (
                "subagents/extractor.md",
                "+++\noutput_schema = \"schemas/extract.json\"\n+++\nExtract.\n",
            ),
            (
                "subagents/schemas/extract.json",
                r#"{"type": "object", "properties": {"names": {"type": "array", "items": {"type": "string"}, "minItems": 1}}, "required": ["names"]}"#,
            ),
        ],
    );
    let scenario = scenario(
        &cluster,
        json!({
            "assistant": { "turns": [ { "steps": [
                { "tool_calls": [ { "name": "spawn_agent", "arguments": { "agent": "extractor", "task": "names in {{input}}" } } ] },
                { "output": { "summary": "extracted {{observations}}" } }
            ] } ] },
            // The worker's run repairs its first answer.
            "extractor": { "turns": [ { "steps": [
                { "output": { "names": [] } },
                { "output": { "names": ["Ada", "Grace"] } }
            ] } ] }
        }),
    );
    cluster.spawn_worker(cluster.worker_config(&["--scenario", &scenario]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));

    let (result, events) = cluster
        .run(&submission("acme", &unique("s"), "the team"))
        .await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let summary = result.output.as_ref().expect("an output")["summary"]
        .as_str()
        .expect("a string")
        .to_owned();
    let extracted: Value = serde_json::from_str(
        summary
            .strip_prefix("extracted ")
            .expect("the summary's prefix"),
    )
    .expect("the subagent's answer is its JSON");
    assert_eq!(extracted, json!({"names": ["Ada", "Grace"]}));
    // The subagent's first answer was discarded on the worker, which said why.
    let child_discards: Vec<&str> = events
        .iter()
        .filter(|e| e.source.starts_with("subagent:"))
        .filter_map(|e| match &e.event {
            EventKind::OutputDiscarded { failure } => Some(failure.message.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(child_discards.len(), 1, "{events:?}");
    assert!(
        child_discards[0].contains("/names: has 0 items; at least 1 are required"),
        "{child_discards:?}"
    );

    // A submission's own schema replaces the agent's: this answer does not match it.
    let own = TaskSubmission {
        output_schema: Some(Box::new(OutputSchema::new(trip_schema()))),
        ..submission("acme", &unique("s"), "the team")
    };
    let (result, _) = cluster.run(&own).await;
    assert_eq!(result.status, TurnStatus::InvalidOutput, "{result:?}");
    assert!(
        result
            .failure
            .as_ref()
            .is_some_and(|f| f.message.contains("\"city\" is missing")),
        "{result:?}"
    );
}

/// Publishes `payload` as a submission of `tenant` (session `raw`) and waits for its final
/// result.
async fn submit_raw(
    cluster: &TestCluster,
    tenant: &str,
    task_id: &str,
    payload: Value,
) -> FinalResult {
    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(client);
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, task_id);
    jetstream
        .publish_with_headers(
            format!("skein.submit.{tenant}.raw"),
            headers,
            payload.to_string().into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored by JetStream");
    let events = cluster
        .client()
        .await
        .watch(tenant, task_id)
        .await
        .expect("watch");
    futures::pin_mut!(events);
    let wait = async {
        while let Some(event) = events.next().await {
            if let EventKind::Final { result } = event.expect("decodable event").event {
                return result;
            }
        }
        panic!("event stream ended without a final result");
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("final result within 30s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_the_validator_cannot_check_is_refused_with_the_reason() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(Vec::new()).await;
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;
    let bad = json!({
        "type": "object",
        "properties": {"when": {"type": "string", "dependentRequired": {}}},
    });

    // The client refuses it before it is published.
    let refused = cluster
        .client()
        .await
        .submit(&TaskSubmission {
            output_schema: Some(Box::new(OutputSchema::new(bad.clone()))),
            ..submission("acme", &unique("s"), "hi")
        })
        .await
        .expect_err("refused");
    match refused {
        ClientError::Rejected(failure) => {
            assert_eq!(failure.kind, FailureKind::InvalidInput);
            assert!(
                failure
                    .message
                    .contains("output_schema: at #/properties/when/dependentRequired"),
                "{failure}"
            );
        }
        other => panic!("expected a rejection, got {other}"),
    }

    // A lead refuses one published past the client, and says why.
    let task_id = unique("task");
    let result = submit_raw(
        &cluster,
        "acme",
        &task_id,
        json!({
            "v": 1, "task_id": task_id, "tenant": "acme", "user": "u", "session": "raw",
            "agent": "assistant", "input": "hi",
            "output_schema": {"schema": {"type": "array", "items": {"type": "string"}}},
        }),
    )
    .await;
    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    let failure = result.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::InvalidInput);
    assert!(
        failure.message.contains("root must be an object schema"),
        "{failure}"
    );
    assert!(model.requests().is_empty(), "no model call was made");
}

async fn skein(args: &[&str]) -> std::process::Output {
    let run = tokio::process::Command::new(SKEIN)
        .args(args)
        .env("SKEIN_LOG_FORMAT", "json")
        .output();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("skein finishes within 60s")
        .expect("skein runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skein_submit_with_a_schema_prints_the_parsed_output() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([
        { "steps": [ { "output": { "city": "{{input}}", "days": 2 } } ] }
    ]));
    cluster.start_nodes(1, &["--scenario", &script]).await;
    let schema_file = cluster.dir.join("trip.schema.json");
    std::fs::write(&schema_file, trip_schema().to_string()).expect("schema written");
    let schema_path = schema_file.display().to_string();

    let human = skein(&[
        "submit",
        "--nats-url",
        &cluster.nats.url,
        "--tenant",
        "acme",
        "--schema",
        &schema_path,
        "Oslo",
    ])
    .await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&human.stdout).into_owned(),
        String::from_utf8_lossy(&human.stderr).into_owned(),
    );
    assert!(human.status.success(), "{stdout}\n{stderr}");
    let printed: Value = serde_json::from_str(&stdout).expect("stdout is the output's JSON");
    assert_eq!(printed, json!({"city": "Oslo", "days": 2}));
    assert!(stdout.contains("\n  \"city\""), "pretty-printed: {stdout}");

    let json_lines = skein(&[
        "submit",
        "--nats-url",
        &cluster.nats.url,
        "--tenant",
        "acme",
        "--schema",
        &schema_path,
        "--json",
        "Rome",
    ])
    .await;
    assert!(json_lines.status.success());
    let last = String::from_utf8_lossy(&json_lines.stdout)
        .lines()
        .last()
        .map(|line| {
            serde_json::from_str::<skein_common::protocol::TurnEvent>(line).expect("an event")
        })
        .expect("some events");
    match last.event {
        EventKind::Final { result } => {
            assert_eq!(result.output, Some(json!({"city": "Rome", "days": 2})));
        }
        other => panic!("the last line is the final result, not {other:?}"),
    }

    // An answer that does not match ends the command with a failure that says why.
    std::fs::write(
        &schema_file,
        json!({"type": "object", "required": ["country"]}).to_string(),
    )
    .expect("schema written");
    let invalid = skein(&[
        "submit",
        "--nats-url",
        &cluster.nats.url,
        "--tenant",
        "acme",
        "--schema",
        &schema_path,
        "Paris",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&invalid.stderr);
    assert!(!invalid.status.success());
    assert!(
        invalid.stdout.is_empty(),
        "nothing on stdout for scripts to read"
    );
    assert!(stderr.contains("invalid output"), "{stderr}");
    assert!(
        stderr.contains("(root): the required property \"country\" is missing"),
        "{stderr}"
    );

    // A schema that cannot be checked is refused before anything is submitted.
    std::fs::write(&schema_file, r#"{"type": "object", "if": {}}"#).expect("schema written");
    let refused = skein(&[
        "submit",
        "--nats-url",
        &cluster.nats.url,
        "--schema",
        &schema_path,
        "hi",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("trip.schema.json cannot be used"),
        "{stderr}"
    );
    assert!(stderr.contains("unsupported keyword \"if\""), "{stderr}");
}

/// The gateway takes the schema the way OpenAI's clients send it: Chat Completions'
/// `response_format` and the Responses API's `text.format`, each reaching the model as the
/// run's output schema; a format Skein cannot hold an answer to is refused with 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_takes_response_format_and_text_format_as_the_runs_schema() {
    use skein_tests::support::gateway::{gateway_with_lead, KEY};
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::answer(r#"{"city": "Oslo", "days": 3}"#),
        FakeReply::answer(r#"{"city": "Rome", "days": 2}"#),
    ])
    .await;
    let addr = gateway_with_lead(&cluster, &model_flags(&model.base_url), &[]).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("http://{addr}/v1/{path}"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };

    let chat = post(
        "chat/completions",
        json!({
            "model": "assistant",
            "messages": [{"role": "user", "content": "a trip north"}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "trip", "schema": trip_schema(), "strict": true}},
        }),
    )
    .await
    .expect("the gateway answers");
    assert_eq!(chat.status(), 200);
    let chat: Value = chat.json().await.expect("JSON");
    let content = chat["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert_eq!(
        serde_json::from_str::<Value>(content).expect("the answer is JSON"),
        json!({"city": "Oslo", "days": 3})
    );

    let response = post(
        "responses",
        json!({
            "model": "assistant",
            "input": "a trip south",
            "text": {"format": {"type": "json_schema", "name": "trip", "schema": trip_schema()}},
        }),
    )
    .await
    .expect("the gateway answers");
    assert_eq!(response.status(), 200);
    let response: Value = response.json().await.expect("JSON");
    assert_eq!(response["status"], "completed", "{response}");
    let text = response["output"][0]["content"][0]["text"]
        .as_str()
        .expect("output text");
    assert_eq!(
        serde_json::from_str::<Value>(text).expect("the answer is JSON"),
        json!({"city": "Rome", "days": 2})
    );

    // Each request reached the model with the schema as its response_format.
    let asked = model.requests();
    assert_eq!(asked.len(), 2, "{asked:?}");
    for body in &asked {
        let format = &body["response_format"];
        assert_eq!(format["type"], "json_schema", "{body}");
        assert_eq!(format["json_schema"]["name"], "trip", "{body}");
        assert_eq!(format["json_schema"]["schema"], trip_schema(), "{body}");
    }

    for (path, body, expected) in [
        (
            "chat/completions",
            json!({"model": "assistant", "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "xml"}}),
            "not supported",
        ),
        (
            "responses",
            json!({"model": "assistant", "input": "x",
                "text": {"format": {"type": "json_schema", "name": "t",
                    "schema": {"type": "object", "if": {}}}}}),
            "\"if\"",
        ),
    ] {
        let refused = post(path, body).await.expect("the gateway answers");
        assert_eq!(refused.status(), 400, "{path}");
        let error: Value = refused.json().await.expect("JSON");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{path}: {error}");
    }
    assert_eq!(
        model.requests().len(),
        2,
        "nothing refused reached the model"
    );
}
