//! How big a model attempt under a budget may be: the pure rule the budget layer applies to what
//! a ledger holds, so it is table-tested without a store.
//!
//! An attempt's worst case is its prompt's bound plus its answer's bound, priced at its model's
//! price. The prompt's bound is its bytes plus a little framing per message
//! ([`prompt_bound`]): no tokenizer makes more tokens of a text than it has bytes. The answer's
//! bound is what the server is told (`max_tokens`), so the server stops there. A ledger that
//! cannot hold the configured answer bound but can hold at least [`MIN_OUTPUT_TOKENS`] (or the
//! configured bound, when that is smaller) of it gets an attempt with the largest answer that
//! fits ([`Sizing::room`]); with less room the attempt is refused.

use crate::agent::model::ModelRequest;
use crate::store::budget::{Hold, LedgerLimits, LedgerState};

use super::Price;

/// The fewest answer tokens an attempt under a budget is made with: with less room left than
/// this, the attempt is refused rather than asked for a sliver of an answer.
pub const MIN_OUTPUT_TOKENS: u64 = 256;

/// The most prompt tokens `request` can cost, whatever the server's tokenizer: the bytes of its
/// messages (with the framing each costs), of its tool specs and of its output schema.
pub fn prompt_bound(request: &ModelRequest) -> u64 {
    use crate::agent::tokens::{schema_upper_bound, upper_bound};
    upper_bound(&request.messages)
        .saturating_add(request.tools.upper_bound())
        .saturating_add(schema_upper_bound(request.output_schema.as_deref()))
}

/// One attempt's prompt bound and price, from which its worst cases follow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sizing {
    /// [`prompt_bound`] of the attempt's request.
    pub prompt: u64,
    /// Its model's price; `None` counts as free (a cost limit without a price never gets here).
    pub price: Option<Price>,
}

/// How much of a limit an attempt would take: tokens, and cost in nano-dollars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Need {
    pub tokens: u64,
    pub cost_nanos: u64,
}

impl Sizing {
    /// The worst case of an attempt whose answer may take `output` tokens.
    pub fn need(&self, output: u64) -> Need {
        Need {
            tokens: self.prompt.saturating_add(output),
            cost_nanos: self
                .price
                .map_or(0, |price| price.worst_cost_nanos(self.prompt, output)),
        }
    }

    /// A fresh reservation of the worst case of an attempt whose answer may take `output`
    /// tokens.
    pub fn hold(&self, output: u64, lease: std::time::Duration) -> Hold {
        let need = self.need(output);
        Hold {
            id: uuid::Uuid::new_v4().simple().to_string(),
            tokens: need.tokens,
            cost_nanos: need.cost_nanos,
            lease,
        }
    }

    /// The most answer tokens, up to `ceiling`, an attempt may take so that its worst case
    /// fits what `limits` leave beside `state` (spent and held); 0 when not even its prompt
    /// fits.
    pub fn room(&self, limits: &LedgerLimits, state: &LedgerState, ceiling: u64) -> u64 {
        let mut room = ceiling;
        if limits.tokens > 0 {
            let used = state.spent_tokens.saturating_add(state.held_tokens);
            let left = limits.tokens.saturating_sub(used);
            if left < self.prompt {
                return 0;
            }
            room = room.min(left - self.prompt);
        }
        if limits.cost_nanos > 0 {
            let used = state.spent_cost_nanos.saturating_add(state.held_cost_nanos);
            let left = limits.cost_nanos.saturating_sub(used);
            room = self.affordable(left, room);
        }
        room
    }

    /// The most answer tokens, up to `ceiling`, whose worst cost stays within `left`
    /// nano-dollars (0 when not even the prompt does). A binary search on the price's own
    /// rounding, so the answer agrees with [`need`](Self::need) to the nano-dollar.
    fn affordable(&self, left: u64, ceiling: u64) -> u64 {
        let fits = |output: u64| self.need(output).cost_nanos <= left;
        if fits(ceiling) {
            return ceiling;
        }
        if !fits(0) {
            return 0;
        }
        // fits(low) and !fits(high) throughout.
        let (mut low, mut high) = (0, ceiling);
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            if fits(middle) {
                low = middle;
            } else {
                high = middle;
            }
        }
        low
    }

    /// Whether an attempt needing `need` goes over `limits` beside `state`: (over tokens, over
    /// cost).
    pub fn over(limits: &LedgerLimits, state: &LedgerState, need: Need) -> (bool, bool) {
        let tokens = state
            .spent_tokens
            .saturating_add(state.held_tokens)
            .saturating_add(need.tokens);
        let cost = state
            .spent_cost_nanos
            .saturating_add(state.held_cost_nanos)
            .saturating_add(need.cost_nanos);
        (
            limits.tokens > 0 && tokens > limits.tokens,
            limits.cost_nanos > 0 && cost > limits.cost_nanos,
        )
    }
}

/// The answer bound to try next after a ledger refused one of `tried` tokens, given the `room`
/// it has ([`Sizing::room`]): a smaller one that fits and is at least `floor`, else none (the
/// attempt is refused).
pub(super) fn smaller_output(tried: u64, room: u64, floor: u64) -> Option<u64> {
    (room >= floor && room < tried).then_some(room)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(tokens: u64, cost_nanos: u64) -> LedgerLimits {
        LedgerLimits { tokens, cost_nanos }
    }

    fn state(spent_tokens: u64, held_tokens: u64, spent_cost: u64, held_cost: u64) -> LedgerState {
        LedgerState {
            spent_tokens,
            spent_cost_nanos: spent_cost,
            held_tokens,
            held_cost_nanos: held_cost,
        }
    }

    /// $1 per output token, input free; and $1 per input token, output at $2.
    const OUTPUT_AT_A_DOLLAR: Price = Price {
        input_per_million: 0.0,
        cache_read_per_million: None,
        cache_write_per_million: None,
        output_per_million: 1_000_000.0,
    };
    const BOTH_PRICED: Price = Price {
        input_per_million: 1_000_000.0,
        cache_read_per_million: None,
        cache_write_per_million: None,
        output_per_million: 2_000_000.0,
    };
    const DOLLAR: u64 = 1_000_000_000;

    #[test]
    fn the_room_left_for_an_answer_is_what_the_limits_leave_beside_the_prompt() {
        let unpriced = |prompt| Sizing {
            prompt,
            price: None,
        };
        // (sizing, limits, state, ceiling, room)
        let cases = [
            // No limit: the ceiling.
            (unpriced(100), limits(0, 0), state(0, 0, 0, 0), 4096, 4096),
            // Plenty left: the ceiling.
            (
                unpriced(100),
                limits(10_000, 0),
                state(0, 0, 0, 0),
                4096,
                4096,
            ),
            // 1000 left, 100 for the prompt: 900 for the answer.
            (unpriced(100), limits(1000, 0), state(0, 0, 0, 0), 4096, 900),
            // What others hold counts as spent.
            (
                unpriced(100),
                limits(1000, 0),
                state(300, 200, 0, 0),
                4096,
                400,
            ),
            // The prompt alone fills it: no room.
            (unpriced(600), limits(1000, 0), state(400, 0, 0, 0), 4096, 0),
            (unpriced(601), limits(1000, 0), state(400, 0, 0, 0), 4096, 0),
            // Spent past the limit already (an answer that used more than it held).
            (unpriced(1), limits(1000, 0), state(1200, 0, 0, 0), 4096, 0),
            // A cost limit on an unpriced model never binds (the layer refuses it earlier).
            (
                unpriced(100),
                limits(0, DOLLAR),
                state(0, 0, 0, 0),
                4096,
                4096,
            ),
            // $9 left at $1 an output token, the prompt free: 9 tokens.
            (
                Sizing {
                    prompt: 5000,
                    price: Some(OUTPUT_AT_A_DOLLAR),
                },
                limits(0, 16 * DOLLAR),
                state(18, 0, 7 * DOLLAR, 0),
                10,
                9,
            ),
            // $20 left, $3 of prompt, $2 a token: 8 tokens ($19), not 9 ($21).
            (
                Sizing {
                    prompt: 3,
                    price: Some(BOTH_PRICED),
                },
                limits(0, 25 * DOLLAR),
                state(0, 0, 5 * DOLLAR, 0),
                4096,
                8,
            ),
            // The tighter of the two limits binds.
            (
                Sizing {
                    prompt: 3,
                    price: Some(BOTH_PRICED),
                },
                limits(10, 25 * DOLLAR),
                state(0, 0, 5 * DOLLAR, 0),
                4096,
                7,
            ),
            // Not even the prompt is affordable.
            (
                Sizing {
                    prompt: 30,
                    price: Some(BOTH_PRICED),
                },
                limits(0, 25 * DOLLAR),
                state(0, 0, 0, 0),
                4096,
                0,
            ),
        ];
        for (at, (sizing, limits, state, ceiling, room)) in cases.into_iter().enumerate() {
            assert_eq!(sizing.room(&limits, &state, ceiling), room, "case {at}");
            if room > 0 {
                // What fits fits, and one more token does not (unless the ceiling stopped it).
                let need = sizing.need(room);
                assert_eq!(
                    Sizing::over(&limits, &state, need),
                    (false, false),
                    "case {at}"
                );
                if room < ceiling {
                    let more = sizing.need(room + 1);
                    assert_ne!(
                        Sizing::over(&limits, &state, more),
                        (false, false),
                        "case {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_refused_attempt_is_tried_smaller_only_with_room_for_some_answer() {
        // (tried, room, floor, next)
        let cases = [
            (4096, 900, 256, Some(900)),
            (4096, 256, 256, Some(256)),
            (4096, 255, 256, None),
            (4096, 0, 256, None),
            // A floor as small as the configured bound: nothing smaller is ever tried.
            (10, 9, 10, None),
            // A ledger that refused with room for all of it (it changed under us): not again.
            (900, 900, 256, None),
        ];
        for (tried, room, floor, next) in cases {
            assert_eq!(
                smaller_output(tried, room, floor),
                next,
                "{tried} {room} {floor}"
            );
        }
    }

    #[test]
    fn the_prompt_bound_is_its_bytes_and_framing_not_a_quarter_of_them() {
        use crate::agent::model::ModelRequest;
        use crate::protocol::message::Message;
        let request = ModelRequest {
            model: "m".into(),
            agent: "a".into(),
            messages: std::sync::Arc::new(vec![Message::user("x".repeat(4000))]),
            tools: Default::default(),
            max_output_tokens: None,
            output_schema: None,
        };
        let bound = prompt_bound(&request);
        assert!(bound >= 4000, "{bound}");
        assert!(bound < 4100, "{bound}");
        assert!(bound > super::super::estimate_prompt_tokens(&request) * 3);
        let sizing = Sizing {
            prompt: bound,
            price: Some(BOTH_PRICED),
        };
        let hold = sizing.hold(10, std::time::Duration::from_secs(1));
        assert_eq!(hold.tokens, bound + 10);
        assert_eq!(hold.cost_nanos, (bound + 20) * DOLLAR);
    }
}
