//! The row state machine, shared by every store.
//!
//! ```text
//!              claim (due)                 publish acked
//!   Pending ───────────────▶ Leased ───────────────────────▶ Published
//!     ▲  ▲                    │  │ │
//!     │  │  retry at T        │  │ │ permanent / exhausted
//!     │  └────────────────────┘  │ └──────────────────────▶ Dead
//!     │        release           │                           │
//!     │◀─────────────────────────┘                           │
//!     │                    lease lapsed: claim again         │
//!     └──────────────────────── replay ◀─────────────────────┘
//! ```
//!
//! SQL stores implement the same transitions as single statements; the in-memory store
//! calls these methods directly. Every completion names the lease token it was claimed
//! with: a completion whose token no longer matches is *fenced* and changes nothing.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::message::chrono_duration;
use crate::store::CompleteAction;

/// The status column. Its [`as_str`](Status::as_str) form is what SQL stores write, as
/// literals, so planners can match partial indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting to be claimed once `available_at` has passed.
    Pending,
    /// Claimed by a relay until `lease_until`; claimable again after that.
    Leased,
    /// The sink acknowledged it.
    Published,
    /// Given up on, with a reason; can be replayed.
    Dead,
}

impl Status {
    /// The lowercase name stored in the `status` column.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Leased => "leased",
            Self::Published => "published",
            Self::Dead => "dead",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "leased" => Self::Leased,
            "published" => Self::Published,
            "dead" => Self::Dead,
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The token a relay receives with a claim; every completion must present it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseToken(Uuid);

impl LeaseToken {
    /// A fresh random token.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
    /// Wraps a stored token.
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }
    /// The underlying UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0)
    }
}

/// A lease on a batch of rows: who holds it, with which token, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The relay that holds it (host and process, for operators).
    pub owner: String,
    /// The fencing token.
    pub token: LeaseToken,
    /// When the lease lapses and the rows become claimable again.
    pub until: DateTime<Utc>,
}

/// Where a row is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowState {
    /// Due at `available_at`.
    Pending {
        /// When it may be claimed.
        available_at: DateTime<Utc>,
    },
    /// Held by a relay.
    Leased(Lease),
    /// Acknowledged by the sink.
    Published {
        /// When the completion was recorded.
        at: DateTime<Utc>,
    },
    /// Given up on.
    Dead {
        /// When it was dead-lettered.
        at: DateTime<Utc>,
        /// Why.
        reason: String,
    },
}

/// A row's state plus the counters that travel with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Where the row is.
    pub state: RowState,
    /// Claims so far (a released claim does not count).
    pub attempts: u32,
    /// The latest failure, kept through retries and into the dead state.
    pub last_error: Option<String>,
}

/// A transition that the current state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The row is not due, or is held by a live lease.
    #[error("row is not claimable")]
    NotClaimable,
    /// The completion's token does not match the row's lease (or the row is not leased).
    #[error("lease token does not match: completion fenced")]
    Fenced,
    /// Only dead rows can be replayed.
    #[error("row is not dead")]
    NotDead,
}

impl Row {
    /// A newly inserted row.
    pub fn new(available_at: DateTime<Utc>) -> Self {
        Self {
            state: RowState::Pending { available_at },
            attempts: 0,
            last_error: None,
        }
    }

    /// The status column for this state.
    pub fn status(&self) -> Status {
        match self.state {
            RowState::Pending { .. } => Status::Pending,
            RowState::Leased(_) => Status::Leased,
            RowState::Published { .. } => Status::Published,
            RowState::Dead { .. } => Status::Dead,
        }
    }

    /// Pending and due, or leased with a lapsed lease.
    pub fn is_claimable(&self, now: DateTime<Utc>) -> bool {
        match &self.state {
            RowState::Pending { available_at } => *available_at <= now,
            RowState::Leased(lease) => lease.until <= now,
            RowState::Published { .. } | RowState::Dead { .. } => false,
        }
    }

    /// When the row becomes claimable, if it ever does without an operator.
    pub fn due_at(&self) -> Option<DateTime<Utc>> {
        match &self.state {
            RowState::Pending { available_at } => Some(*available_at),
            RowState::Leased(lease) => Some(lease.until),
            RowState::Published { .. } | RowState::Dead { .. } => None,
        }
    }

    /// Pending/lapsed → Leased; counts an attempt.
    pub fn claim(&mut self, now: DateTime<Utc>, lease: Lease) -> Result<(), TransitionError> {
        if !self.is_claimable(now) {
            return Err(TransitionError::NotClaimable);
        }
        self.state = RowState::Leased(lease);
        self.attempts += 1;
        Ok(())
    }

    /// Leased (with this token) → Published, Pending at `now + delay`, or Dead.
    ///
    /// A lapsed lease that nobody reclaimed still completes: the token is the fence,
    /// not the clock.
    pub fn complete(
        &mut self,
        token: LeaseToken,
        now: DateTime<Utc>,
        action: &CompleteAction,
    ) -> Result<(), TransitionError> {
        self.check_token(token)?;
        match action {
            CompleteAction::Published => {
                self.state = RowState::Published { at: now };
            }
            CompleteAction::Retry { delay, error } => {
                self.state = RowState::Pending {
                    available_at: now + chrono_duration(*delay),
                };
                self.last_error = Some(error.clone());
            }
            CompleteAction::Defer { delay, error } => {
                self.state = RowState::Pending {
                    available_at: now + chrono_duration(*delay),
                };
                self.attempts = self.attempts.saturating_sub(1);
                self.last_error = Some(error.clone());
            }
            CompleteAction::Dead { reason } => {
                self.state = RowState::Dead {
                    at: now,
                    reason: reason.clone(),
                };
                self.last_error = Some(reason.clone());
            }
        }
        Ok(())
    }

    /// Leased (with this token) → Pending now, without counting the attempt.
    pub fn release(
        &mut self,
        token: LeaseToken,
        now: DateTime<Utc>,
    ) -> Result<(), TransitionError> {
        self.check_token(token)?;
        self.state = RowState::Pending { available_at: now };
        self.attempts = self.attempts.saturating_sub(1);
        Ok(())
    }

    /// Dead → Pending now, with a fresh attempt count.
    pub fn replay(&mut self, now: DateTime<Utc>) -> Result<(), TransitionError> {
        if !matches!(self.state, RowState::Dead { .. }) {
            return Err(TransitionError::NotDead);
        }
        self.state = RowState::Pending { available_at: now };
        self.attempts = 0;
        Ok(())
    }

    fn check_token(&self, token: LeaseToken) -> Result<(), TransitionError> {
        match &self.state {
            RowState::Leased(lease) if lease.token == token => Ok(()),
            _ => Err(TransitionError::Fenced),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn lease(now: DateTime<Utc>, secs: i64) -> Lease {
        Lease {
            owner: "relay-a".into(),
            token: LeaseToken::new(),
            until: now + chrono::Duration::seconds(secs),
        }
    }

    #[test]
    fn status_names_round_trip() {
        for s in [
            Status::Pending,
            Status::Leased,
            Status::Published,
            Status::Dead,
        ] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("PENDING"), None);
    }

    #[test]
    fn claim_only_when_due_or_lapsed() {
        let now = Utc::now();
        let mut row = Row::new(now + chrono::Duration::seconds(5));
        assert_eq!(
            row.claim(now, lease(now, 30)),
            Err(TransitionError::NotClaimable)
        );
        let later = now + chrono::Duration::seconds(5);
        row.claim(later, lease(later, 30)).unwrap();
        assert_eq!(row.attempts, 1);
        assert_eq!(
            row.claim(later, lease(later, 30)),
            Err(TransitionError::NotClaimable)
        );
        let lapsed = later + chrono::Duration::seconds(30);
        row.claim(lapsed, lease(lapsed, 30)).unwrap();
        assert_eq!(row.attempts, 2);
    }

    #[test]
    fn stale_token_is_fenced_and_changes_nothing() {
        let now = Utc::now();
        let mut row = Row::new(now);
        let first = lease(now, 1);
        row.claim(now, first.clone()).unwrap();
        let later = now + chrono::Duration::seconds(2);
        row.claim(later, lease(later, 30)).unwrap();
        let before = row.clone();
        for action in [
            CompleteAction::Published,
            CompleteAction::Dead { reason: "x".into() },
            CompleteAction::Retry {
                delay: Duration::ZERO,
                error: "x".into(),
            },
        ] {
            assert_eq!(
                row.complete(first.token, later, &action),
                Err(TransitionError::Fenced)
            );
        }
        assert_eq!(
            row.release(first.token, later),
            Err(TransitionError::Fenced)
        );
        assert_eq!(row, before);
    }

    #[test]
    fn retry_release_and_replay() {
        let now = Utc::now();
        let mut row = Row::new(now);
        let l = lease(now, 30);
        row.claim(now, l.clone()).unwrap();
        let retry = CompleteAction::Retry {
            delay: Duration::from_secs(10),
            error: "503".into(),
        };
        row.complete(l.token, now, &retry).unwrap();
        assert_eq!(row.due_at(), Some(now + chrono::Duration::seconds(10)));
        assert_eq!(row.last_error.as_deref(), Some("503"));

        let at = now + chrono::Duration::seconds(10);
        let l = lease(at, 30);
        row.claim(at, l.clone()).unwrap();
        assert_eq!(row.attempts, 2);
        row.release(l.token, at).unwrap();
        assert_eq!(row.attempts, 1);
        assert!(row.is_claimable(at));

        assert_eq!(row.replay(at), Err(TransitionError::NotDead));
        let l = lease(at, 30);
        row.claim(at, l.clone()).unwrap();
        row.complete(
            l.token,
            at,
            &CompleteAction::Dead {
                reason: "bad".into(),
            },
        )
        .unwrap();
        assert_eq!(row.status(), Status::Dead);
        assert!(!row.is_claimable(at + chrono::Duration::days(1)));
        row.replay(at).unwrap();
        assert_eq!((row.status(), row.attempts), (Status::Pending, 0));
    }
}
