//! `Slots`: how many messages of one intake run at once, and the loan that lets a task waiting
//! on work of the same intake (a subagent turn waiting for its own subagents) give its slot up
//! while it waits, so nested work can never wait on slots held by its own callers.
//!
//! Invariant: a task that holds a slot and lends it is not running; a loan is repaid (the slot
//! taken back) before the task goes on, so the tasks running at once never exceed the capacity
//! for long. Lent slots add capacity only while their lenders wait, so nesting of depth `d`
//! holds at most `capacity × (d + 1)` messages, a bound the caller's depth limit sets.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots of one intake ([`super::Intake::serve`]).
#[derive(Debug, Clone)]
pub struct Slots {
    semaphore: Arc<Semaphore>,
}

impl Slots {
    /// `capacity` slots (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            semaphore: Arc::new(Semaphore::new(capacity.max(1))),
        }
    }

    /// Waits for a free slot.
    pub(super) async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.semaphore.clone().acquire_owned().await.ok()
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.semaphore.available_permits()
    }

    /// Takes up to `count` more free slots into `held`, if that many are free.
    pub(super) fn take_more(&self, held: &mut OwnedSemaphorePermit, count: usize) {
        if count == 0 {
            return;
        }
        if let Ok(extra) = self.semaphore.clone().try_acquire_many_owned(count as u32) {
            held.merge(extra);
        }
    }

    /// Lends the caller's slot while it waits: one more message may run until the loan is
    /// repaid.
    pub fn lend(&self) -> Loan {
        self.semaphore.add_permits(1);
        Loan {
            semaphore: Some(self.semaphore.clone()),
        }
    }
}

/// A slot lent by a waiting task. [`Loan::repay`] takes it back, waiting for a slot to free up
/// if every one is in use; a loan dropped unpaid (its task was cancelled) is repaid in the
/// background.
#[derive(Debug)]
#[must_use = "a loan adds a slot until it is repaid"]
pub struct Loan {
    semaphore: Option<Arc<Semaphore>>,
}

impl Loan {
    /// Takes the lent slot back before the lender goes on.
    pub async fn repay(mut self) {
        if let Some(semaphore) = self.semaphore.take() {
            if let Ok(permit) = semaphore.acquire_owned().await {
                permit.forget();
            }
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        let Some(semaphore) = self.semaphore.take() else {
            return;
        };
        match semaphore.clone().try_acquire_owned() {
            Ok(permit) => permit.forget(),
            Err(_) => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        if let Ok(permit) = semaphore.acquire_owned().await {
                            permit.forget();
                        }
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_loan_adds_a_slot_until_it_is_repaid() {
        let slots = Slots::new(1);
        let held = slots.acquire().await.expect("a slot");
        assert_eq!(slots.free(), 0);
        let loan = slots.lend();
        assert_eq!(slots.free(), 1, "the lent slot is free for nested work");
        let nested = slots.acquire().await.expect("the lent slot");
        // Repaying waits until the nested work gives its slot back.
        let repaid = tokio::spawn(loan.repay());
        tokio::task::yield_now().await;
        assert!(!repaid.is_finished(), "repaid before a slot was free");
        drop(nested);
        repaid.await.expect("repaid");
        assert_eq!(slots.free(), 0, "back to one slot, held by the lender");
        drop(held);
        assert_eq!(slots.free(), 1);
    }

    #[tokio::test]
    async fn a_dropped_loan_is_repaid_in_the_background() {
        let slots = Slots::new(2);
        let held = slots.acquire().await.expect("a slot");
        let loan = slots.lend();
        let nested = slots.acquire().await.expect("a slot");
        let other = slots.acquire().await.expect("the lent slot");
        drop(loan);
        assert_eq!(slots.free(), 0);
        drop(other);
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert_eq!(slots.free(), 0, "the freed slot went to repay the loan");
        drop((held, nested));
        assert_eq!(slots.free(), 2, "capacity is back to two");
    }
}
