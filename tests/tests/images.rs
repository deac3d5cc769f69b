//! Images in, end to end through a real NATS and Redis: a submission's content parts (text, an
//! image by URL, a small and a large image inline, an image stored by payload reference) reach
//! the OpenAI-compatible fake as image parts, while the session keeps large images by reference
//! (one whose stored bytes are gone is named in a note on a later turn);
//! an MCP tool's image reaches the Anthropic fake inside the call's `tool_result`, and the
//! OpenAI-compatible fake in a user message after the step's results; images past the caps and
//! malformed parts are refused with clear failures (a tool's, as its call's failure); a model
//! configured without images fails the turn before anything is sent; the scripted model counts
//! the images it is shown; the HTTP gateway takes the image parts of chat completions, Responses
//! and Agent Protocol runs.

use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use base64::Engine;
use futures::StreamExt;
use serde_json::{json, Value};
use skein_common::protocol::content::ImageUrl;
use skein_common::protocol::message::Role;
use skein_common::protocol::{
    EventKind, FailureKind, FinalResult, ImagePart, InputPart, SubmissionInput, TurnStatus,
};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::fake_anthropic::{blocks_of_type, AnthropicReply, FakeAnthropic};
use skein_tests::support::mcp_fixture::FIXTURE_PNG;
use skein_tests::support::{unique, FakeOpenAi, FakeReply};

const FIXTURE: &str = env!("CARGO_BIN_EXE_skein-mcp-fixture");

fn encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn url_part(url: &str) -> InputPart {
    InputPart::ImageUrl {
        image_url: ImageUrl {
            url: url.to_owned(),
            detail: None,
        },
    }
}

fn text_part(text: &str) -> InputPart {
    InputPart::Text {
        text: text.to_owned(),
    }
}

/// The `image_url` URLs of a chat message's content parts, in order.
fn image_urls(message: &Value) -> Vec<String> {
    message["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|part| part["type"] == "image_url")
        .map(|part| {
            part["image_url"]["url"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// A worker with the MCP fixture as server `fixture`.
fn mcp_worker_flags(cluster: &TestCluster) -> Vec<String> {
    let path = cluster.dir.join(unique("mcp")).with_extension("json");
    let config = json!({ "mcpServers": { "fixture": { "command": FIXTURE, "args": [] } } });
    std::fs::write(&path, config.to_string()).expect("config written");
    vec!["--mcp-config".into(), path.display().to_string()]
}

fn failure_of(result: &FinalResult) -> (FailureKind, String) {
    let failure = result.failure.as_ref().expect("a failure");
    (failure.kind, failure.message.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submissions_images_reach_the_model_as_image_parts_and_large_ones_stay_stored() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::answer("four images"),
        FakeReply::answer("three are left"),
    ])
    .await;
    cluster.spawn_lead(cluster.lead_config(&model_flags(&model.base_url)));

    let session = unique("s");
    let mut task = submission("acme", &session, "unused");
    // An image too large for one message goes to the payload bucket first.
    let large: Vec<u8> = (0..600 * 1024).map(|i| (i % 251) as u8).collect();
    let stored = cluster
        .client()
        .await
        .store_payload("acme", &session, &task.task_id, large.clone().into())
        .await
        .expect("the image is stored");
    let small = encode(b"tiny png bytes");
    let inline_large = encode(&vec![7u8; 20 * 1024]);
    task.input = SubmissionInput::Parts(vec![
        text_part("What do these show?"),
        url_part("https://images.example.com/cat.png"),
        url_part(&format!("data:image/png;base64,{small}")),
        url_part(&format!("data:image/jpeg;base64,{inline_large}")),
        InputPart::Image {
            payload: stored.clone(),
            media_type: "image/webp".into(),
        },
    ]);
    let (result, _) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("four images"));

    // The provider sent the text, then every image: by URL, or its bytes as a data: URL.
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    let user = requests[0]["messages"]
        .as_array()
        .and_then(|messages| messages.iter().find(|m| m["role"] == "user"))
        .cloned()
        .expect("a user message");
    assert_eq!(
        user["content"][0],
        json!({ "type": "text", "text": "What do these show?" })
    );
    assert_eq!(
        image_urls(&user),
        vec![
            "https://images.example.com/cat.png".to_owned(),
            format!("data:image/png;base64,{small}"),
            format!("data:image/jpeg;base64,{inline_large}"),
            format!("data:image/webp;base64,{}", encode(&large)),
        ]
    );

    // The session keeps the small image inline and the large ones by reference only.
    let loaded = cluster
        .store()
        .await
        .load("acme", &session)
        .await
        .expect("the session loads");
    let kept = loaded
        .state
        .history
        .iter()
        .find(|m| m.role == Role::User)
        .expect("the user's message is kept");
    assert_eq!(kept.content, "What do these show?");
    assert_eq!(kept.images.len(), 4, "{:?}", kept.images);
    assert!(matches!(&kept.images[0], ImagePart::Url { .. }));
    assert!(matches!(&kept.images[1], ImagePart::Base64 { data, .. } if *data == small));
    assert!(
        matches!(&kept.images[2], ImagePart::Payload { media_type, payload }
            if media_type == "image/jpeg" && payload.size == 20 * 1024),
        "{:?}",
        kept.images[2]
    );
    assert!(
        matches!(&kept.images[3], ImagePart::Payload { payload, .. } if *payload == stored),
        "{:?}",
        kept.images[3]
    );
    let stored_history = serde_json::to_string(&loaded.state.history).expect("encodes");
    assert!(
        stored_history.len() < 8 * 1024,
        "no large image's bytes are kept in the session ({} bytes)",
        stored_history.len()
    );

    // A stored image gone from its bucket (as after the retention) is named in a note on a later
    // turn, not dropped silently; the others are still shown.
    let nats = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    async_nats::jetstream::new(nats)
        .get_object_store(&stored.bucket)
        .await
        .expect("the payload bucket")
        .delete(&stored.name)
        .await
        .expect("the object is deleted");
    let (later, _) = cluster.run(&submission("acme", &session, "and now?")).await;
    assert_eq!(later.status, TurnStatus::Completed, "{later:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let first_user = requests[1]["messages"]
        .as_array()
        .and_then(|messages| messages.iter().find(|m| m["role"] == "user"))
        .cloned()
        .expect("the first turn's user message");
    assert_eq!(image_urls(&first_user).len(), 3, "{first_user}");
    let text = first_user["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.starts_with(
            "What do these show?\n[image/webp image of 614400 bytes is no longer stored"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tools_image_goes_to_the_model_inside_the_calls_tool_result() {
    let cluster = TestCluster::start();
    let model = FakeAnthropic::start(vec![
        AnthropicReply::tools(vec![("mcp__fixture__image", json!({}))]),
        AnthropicReply::answer("a red dot"),
    ])
    .await;
    let flags = mcp_worker_flags(&cluster);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    cluster.spawn_worker(cluster.worker_config(&flags));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--model-provider",
        "anthropic",
        "--model-base-url",
        &model.base_url,
        "--model",
        "claude-sonnet-4-5",
    ]));

    let task = submission("acme", &unique("s"), "what does the image tool show?");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let finished: Vec<bool> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ToolFinished { ok, .. } => Some(*ok),
            _ => None,
        })
        .collect();
    assert_eq!(finished, vec![true]);

    let requests = model.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let results = blocks_of_type(&requests[1].body, "tool_result");
    assert_eq!(results.len(), 1, "{results:?}");
    let content = results[0]["content"]
        .as_array()
        .expect("text and image blocks");
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("a red dot") && text.contains("[image 1: image/png"),
        "{text}"
    );
    assert_eq!(
        content[1],
        json!({ "type": "image", "source":
            { "type": "base64", "media_type": "image/png", "data": FIXTURE_PNG } })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_past_the_caps_and_malformed_parts_are_refused_with_clear_failures() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            ("mcp__fixture__image".into(), json!({ "bytes": 5000 })),
            ("mcp__fixture__image".into(), json!({})),
        ]),
        FakeReply::answer("one image was too large"),
    ])
    .await;
    let flags = mcp_worker_flags(&cluster);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    cluster.spawn_worker(cluster.worker_config(&flags));
    cluster.wait_for_workers(1).await;
    let mut lead_flags = model_flags(&model.base_url).to_vec();
    lead_flags.extend(["--model-max-image-bytes", "1000", "--model-max-images", "2"]);
    cluster.spawn_lead(cluster.lead_config(&lead_flags));

    // An inline image over the byte cap.
    let mut large = submission("acme", &unique("s"), "");
    large.input = SubmissionInput::Parts(vec![
        text_part("look"),
        url_part(&format!("data:image/png;base64,{}", encode(&[1u8; 1001]))),
    ]);
    let (refused, _) = cluster.run(&large).await;
    assert_eq!(refused.status, TurnStatus::Failed, "{refused:?}");
    let (kind, message) = failure_of(&refused);
    assert_eq!(kind, FailureKind::TooLarge);
    assert!(
        message.contains("1001 bytes") && message.contains("SKEIN_MODEL_MAX_IMAGE_BYTES"),
        "{message}"
    );

    // Three images where two are taken.
    let mut many = submission("acme", &unique("s"), "");
    many.input = SubmissionInput::Parts(
        (1..=3)
            .map(|n| url_part(&format!("https://images.example.com/{n}.png")))
            .collect(),
    );
    let (refused, _) = cluster.run(&many).await;
    let (kind, message) = failure_of(&refused);
    assert_eq!(kind, FailureKind::TooLarge);
    assert!(message.contains("SKEIN_MODEL_MAX_IMAGES"), "{message}");

    // A part of no known type, published as raw JSON (no client would build it).
    let task_id = unique("bad-part");
    let raw = json!({"v": 1, "task_id": task_id, "tenant": "acme", "user": "u",
        "session": "raw", "agent": "assistant",
        "input": [{"type": "text", "text": "hi"}, {"type": "audio", "data": "x"}]});
    let malformed = submit_raw(&cluster, &task_id, raw).await;
    let (kind, message) = failure_of(&malformed);
    assert_eq!(kind, FailureKind::InvalidInput);
    assert!(message.contains("input part 2 (\"audio\")"), "{message}");
    assert!(
        model.requests().is_empty(),
        "no refused input reached the model"
    );

    // A tool's image over the cap fails its call: the model is told, not shown less. The image
    // of the other call, within the cap, follows the step's results in a user message that names
    // its call (a `tool` message takes text only).
    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "show me"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let observed = skein_tests::support::fake_openai::tool_messages(&requests[1]);
    assert_eq!(observed.len(), 2, "{observed:?}");
    assert!(
        observed[0].starts_with("error (too_large): image 1 of the tool's result is 5000 bytes"),
        "{observed:?}"
    );
    assert!(observed[1].contains("[image 1: image/png"), "{observed:?}");
    let messages = requests[1]["messages"].as_array().expect("messages");
    let second_call = messages
        .iter()
        .find_map(|m| m["tool_calls"][1]["id"].as_str())
        .expect("the model's second call")
        .to_owned();
    let last = messages.last().expect("a last message");
    assert_eq!(last["role"], "user", "{last}");
    assert_eq!(
        last["content"][0]["text"],
        format!("The result of tool call {second_call} holds 1 image(s):")
    );
    assert_eq!(
        image_urls(last),
        vec![format!("data:image/png;base64,{FIXTURE_PNG}")]
    );
    let shown: usize = messages.iter().map(|m| image_urls(m).len()).sum();
    assert_eq!(shown, 1, "only the image within the cap is sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_configured_without_images_fails_the_turn_before_sending_it() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("never asked")]).await;
    let mut lead_flags = model_flags(&model.base_url).to_vec();
    lead_flags.extend(["--model", "text-only-model", "--model-images", "false"]);
    cluster.spawn_lead(cluster.lead_config(&lead_flags));

    let mut task = submission("acme", &unique("s"), "");
    task.input = SubmissionInput::Parts(vec![
        text_part("what is this?"),
        url_part("https://images.example.com/cat.png"),
    ]);
    let (result, _) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    let (kind, message) = failure_of(&result);
    assert_eq!(kind, FailureKind::InvalidInput);
    assert!(
        message.contains("model text-only-model of provider openai")
            && message.contains("SKEIN_MODEL_IMAGES=false"),
        "{message}"
    );
    assert_eq!(model.arrived(), 0, "nothing was sent");

    // Text alone still runs.
    let (plain, _) = cluster
        .run(&submission("acme", &unique("s"), "just text"))
        .await;
    assert_eq!(plain.status, TurnStatus::Completed, "{plain:?}");
    assert_eq!(plain.answer.as_deref(), Some("never asked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripted_model_counts_the_images_it_is_shown() {
    let cluster = TestCluster::start();
    let scenario =
        cluster.scenario(json!([{ "steps": [{ "answer": "I saw {{images}} images" }] }]));
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario]));
    let mut task = submission("acme", &unique("s"), "");
    task.input = SubmissionInput::Parts(vec![
        text_part("count them"),
        url_part("https://images.example.com/1.png"),
        url_part(&format!("data:image/gif;base64,{}", encode(b"GIF89a"))),
    ]);
    let (result, _) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("I saw 2 images"));
}

/// Publishes `body` as a submission of tenant `acme`, as any NATS client could, and waits for
/// its final result.
async fn submit_raw(cluster: &TestCluster, task_id: &str, body: Value) -> FinalResult {
    let nats = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(nats);
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, task_id);
    let events = cluster
        .client()
        .await
        .watch("acme", task_id)
        .await
        .expect("watch");
    jetstream
        .publish_with_headers("skein.submit.acme.raw", headers, body.to_string().into())
        .await
        .expect("publish")
        .await
        .expect("stored by JetStream");
    futures::pin_mut!(events);
    let wait = async {
        while let Some(event) = events.next().await {
            if let EventKind::Final { result } = event.expect("decodable event").event {
                return result;
            }
        }
        panic!("events ended without a final result");
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("a final result in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_gateway_takes_image_parts_of_chat_responses_and_agent_protocol_requests() {
    use skein_tests::support::gateway::{chat, gateway_before, KEY};
    let cluster = TestCluster::start();
    let scenario = cluster.scenario(json!([{ "steps": [{ "answer": "saw {{images}} images" }] }]));
    let addr = gateway_before(&cluster, &scenario, &[]).await;
    let http = reqwest::Client::new();

    let completion: Value = http
        .post(chat(addr))
        .bearer_auth(KEY)
        .json(
            &json!({ "model": "assistant", "messages": [{ "role": "user", "content": [
            { "type": "text", "text": "what are these?" },
            { "type": "image_url", "image_url": { "url": "https://images.example.com/1.png" } },
            { "type": "image_url", "image_url": { "url": "https://images.example.com/2.png" } }
        ] }] }),
        )
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(
        completion["choices"][0]["message"]["content"], "saw 2 images",
        "{completion}"
    );

    let response = http
        .post(format!("http://{addr}/v1/responses"))
        .bearer_auth(KEY)
        .json(
            &json!({ "model": "assistant", "input": [{ "role": "user", "content": [
            { "type": "input_text", "text": "and this?" },
            { "type": "input_image", "image_url": format!("data:image/png;base64,{FIXTURE_PNG}") }
        ] }] }),
        )
        .send()
        .await
        .expect("sent");
    assert!(response.status().is_success(), "{}", response.status());
    let body = response.text().await.expect("a body");
    assert!(body.contains("saw 1 images"), "{body}");

    // An Agent Protocol run: LangChain's content parts.
    let waited = http
        .post(format!("http://{addr}/runs/wait"))
        .header("x-api-key", KEY)
        .json(
            &json!({ "assistant_id": "assistant", "input": { "messages": [
            { "role": "user", "content": [
                { "type": "text", "text": "and these?" },
                { "type": "image_url", "image_url": { "url": "https://images.example.com/3.png" } },
                { "type": "image_url", "image_url": { "url": "https://images.example.com/4.png" } },
                { "type": "image_url", "image_url": { "url": "https://images.example.com/5.png" } }
            ] }
        ] } }),
        )
        .send()
        .await
        .expect("sent");
    assert!(waited.status().is_success(), "{}", waited.status());
    let values = waited.text().await.expect("a body");
    assert!(values.contains("saw 3 images"), "{values}");

    // A malformed image is a 400 naming the part, before anything runs.
    let refused = http
        .post(chat(addr))
        .bearer_auth(KEY)
        .json(
            &json!({ "model": "assistant", "messages": [{ "role": "user", "content": [
            { "type": "image_url", "image_url": { "url": "ftp://example.com/a.png" } }
        ] }] }),
        )
        .send()
        .await
        .expect("sent");
    assert_eq!(refused.status(), reqwest::StatusCode::BAD_REQUEST);
    let said = refused.text().await.expect("a body");
    assert!(
        said.contains("input part 1: an image URL must be https://"),
        "{said}"
    );
}
