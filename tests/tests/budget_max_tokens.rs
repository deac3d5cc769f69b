//! A budget held to the token through the real provider: each model call under a budget is sent
//! the answer bound it reserved (`max_tokens` on an OpenAI-compatible server), the bound shrinks
//! to what the task's or the tenant's budget has left, and a model that would answer at length
//! is cut there, so the turn's spending never passes its budget.
//!
//! The fake server obeys the bound as a real one does, and counts every byte of the prompt as a
//! token: the most any tokenizer could charge, so the budget holds even against the prompt's
//! worst case, not only its estimate.

use serde_json::json;
use skein_common::protocol::{Budget, FinalResult, TurnStatus};
use skein_common::store::budget::{Ledger, LedgerLimits};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::fake_openai::LONG_ANSWER_WORD;
use skein_tests::support::{unique, FakeOpenAi, FakeReply};

/// The answer bound configured for every call: far more than any budget here leaves.
const CONFIGURED_BOUND: u64 = 100_000;
/// Words the model would answer with, unbounded.
const LONG_ANSWER: u64 = 1_000_000;
/// The budget of the token cases: room for the first calls' prompts (a few thousand bytes) and
/// a long answer, far less than the configured bound.
const TOKEN_BUDGET: u64 = 20_000;

/// What one run of "ask a tool, then answer at length" came to.
struct Run {
    result: FinalResult,
    model: FakeOpenAi,
}

/// Runs a task whose model first calls a tool, then answers at length, under `flags` (besides
/// the fake model and the configured bound) and the task's `budget`.
async fn tool_then_long_answer(
    cluster: &TestCluster,
    tenant: &str,
    extra: &[&str],
    budget: Option<Budget>,
) -> Run {
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("no_such_tool", json!({})),
        FakeReply::Long(LONG_ANSWER),
    ])
    .await;
    model.count_prompt_bytes();
    let bound = CONFIGURED_BOUND.to_string();
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--model-max-output-tokens", bound.as_str()]);
    flags.extend(extra);
    cluster.start_nodes(0, &flags).await;

    let mut task = submission(tenant, &unique("s"), "tell me everything");
    task.budget = budget;
    let (result, _) = cluster.run(&task).await;
    Run { result, model }
}

/// Asserts the run answered at the length its budget left, each call bounded in `max_tokens`.
fn assert_cut_to_the_budget(run: &Run) -> (u64, u64) {
    let Run { result, model } = run;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    for body in &requests {
        // 127.0.0.1 is an OpenAI-compatible server: `max_tokens`, never both fields.
        assert!(body["max_tokens"].is_u64(), "{body}");
        assert!(body.get("max_completion_tokens").is_none(), "{body}");
    }
    let bounds: Vec<u64> = model.answer_bounds().into_iter().flatten().collect();
    let [first, second] = bounds[..] else {
        panic!("two bounds: {bounds:?}");
    };
    // The budget, not the configured bound, sized both calls; the second had less left.
    assert!(first < CONFIGURED_BOUND, "{first}");
    assert!(second < first, "{first} {second}");
    // The model would have gone on: its answer stopped at the bound, every word of it.
    let answer = result.answer.as_deref().expect("an answer");
    assert_eq!(answer.split_whitespace().count() as u64, second);
    assert!(answer
        .split_whitespace()
        .all(|word| word == LONG_ANSWER_WORD));
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_cut_where_the_tasks_token_budget_ends_and_never_passes_it() {
    let cluster = TestCluster::start();
    let tenant = unique("acme");
    let budget = Budget {
        max_total_tokens: Some(TOKEN_BUDGET),
        max_cost_usd: None,
    };
    let run = tool_then_long_answer(&cluster, &tenant, &[], Some(budget)).await;
    let (_, second) = assert_cut_to_the_budget(&run);

    let spent = run
        .result
        .spent
        .expect("a task under a budget says what it spent");
    assert!(spent.tokens <= TOKEN_BUDGET, "{spent:?}");
    // The second call was given what the budget had left beside its prompt's bound: what stays
    // unspent is only the framing that bound counts per message, not an unused answer.
    assert!(spent.tokens > TOKEN_BUDGET - 200, "{spent:?}");
    assert!(spent.tokens > second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_cut_where_the_tenants_day_ends_and_never_passes_it() {
    let cluster = TestCluster::start();
    let tenant = unique("acme");
    let daily = TOKEN_BUDGET.to_string();
    let run =
        tool_then_long_answer(&cluster, &tenant, &["--tenant-daily-tokens", &daily], None).await;
    assert_cut_to_the_budget(&run);

    let store = cluster.store().await;
    let day = store
        .budget_ledger(&Ledger::tenant_today(&tenant, LedgerLimits::default()))
        .await
        .expect("ledger reads");
    assert_eq!(day.held_tokens, 0, "nothing stays held");
    assert!(day.spent_tokens <= TOKEN_BUDGET, "{day:?}");
    assert!(day.spent_tokens > TOKEN_BUDGET - 200, "{day:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_cut_where_the_cost_budget_ends_to_the_nano_dollar() {
    let cluster = TestCluster::start();
    // $0.001 an output token, the prompt free: a $5 budget pays for 5000 output tokens.
    let prices = r#"{"*": {"input_per_million": 0, "output_per_million": 1000}}"#;
    let budget = Budget {
        max_total_tokens: None,
        max_cost_usd: Some(5.0),
    };
    let run = tool_then_long_answer(
        &cluster,
        &unique("acme"),
        &["--model-prices", prices],
        Some(budget),
    )
    .await;
    let (first, second) = assert_cut_to_the_budget(&run);
    // The first call could have taken all $5; the tool call used 7 tokens of it; the answer got
    // the rest.
    assert_eq!(first, 5000);
    assert_eq!(second, 5000 - 7);
    let spent = run
        .result
        .spent
        .expect("a task under a budget says what it spent");
    assert_eq!(spent.cost_usd, 5.0, "{spent:?}");
}
