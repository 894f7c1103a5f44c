//! Money caps: warn and block levels, per session and per accounting day, per consumer.
//!
//! # Holds
//! A call's worst-case cost is **held** against every cap it is under, atomically with its claim.
//! A call is admitted only if `settled + held + its hold ≤ block` for every block cap, so parallel
//! calls can never pass a block cap together. Settlement releases the hold and adds the actual
//! cost; a post-call block (`settled > block`) is possible only when the actual cost exceeded the
//! worst case (a provider that ignored the output cap).

use crate::money::Money;
use serde::{Deserialize, Serialize};

/// Which spend a cap is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapWindow {
    /// The consumer's spend in this session.
    Session,
    /// The consumer's spend on this accounting day.
    Daily,
}

impl CapWindow {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Daily => "daily",
        }
    }
}

/// Warn or block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapLevel {
    /// Crossing it adds a warning; output is kept (SC-15).
    Warn,
    /// Crossing it refuses (preflight) or suppresses output (post-call) (SC-16).
    Block,
}

/// The caps of a call profile. Any subset may be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Caps {
    /// Session warn level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_warn: Option<Money>,
    /// Session block level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_block: Option<Money>,
    /// Daily warn level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_warn: Option<Money>,
    /// Daily block level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_block: Option<Money>,
}

/// Settled and held totals of one spend row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SpendTotals {
    /// Sum of settled charges.
    pub settled: Money,
    /// Sum of worst-case holds of calls in flight.
    pub held: Money,
}

/// A block cap that refused a call before dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{window:?} block cap {limit} would be exceeded")]
pub struct CapBlocked {
    /// Which cap.
    pub window: CapWindow,
    /// The cap's level.
    pub limit: Money,
    /// Settled spend at the time.
    pub settled: Money,
    /// Held spend at the time.
    pub held: Money,
    /// The refused call's hold.
    pub hold: Money,
}

/// A cap crossed after settlement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapWarning {
    /// `session` or `daily`.
    pub cap: CapWindow,
    /// `warn` or `block`.
    pub level: CapLevel,
    /// The cap's level.
    pub limit: Money,
    /// Settled spend after this call.
    pub spent: Money,
}

impl Caps {
    fn block(&self, window: CapWindow) -> Option<Money> {
        match window {
            CapWindow::Session => self.session_block,
            CapWindow::Daily => self.daily_block,
        }
    }

    fn warn(&self, window: CapWindow) -> Option<Money> {
        match window {
            CapWindow::Session => self.session_warn,
            CapWindow::Daily => self.daily_warn,
        }
    }

    /// Preflight: may a call holding `hold` be admitted given the current totals?
    ///
    /// # Errors
    /// The first block cap (session before daily) that `settled + held + hold` would exceed.
    pub fn admit(
        &self,
        session: SpendTotals,
        daily: SpendTotals,
        hold: Money,
    ) -> Result<(), CapBlocked> {
        for (window, totals) in [(CapWindow::Session, session), (CapWindow::Daily, daily)] {
            let Some(limit) = self.block(window) else {
                continue;
            };
            let would = totals
                .settled
                .checked_add(totals.held)
                .and_then(|s| s.checked_add(hold));
            let exceeds = match would {
                Ok(total) => total > limit,
                Err(_) => true,
            };
            if exceeds {
                return Err(CapBlocked {
                    window,
                    limit,
                    settled: totals.settled,
                    held: totals.held,
                    hold,
                });
            }
        }
        Ok(())
    }

    /// After settlement: the warn caps crossed and the block caps exceeded, given settled spend.
    /// A warn cap counts as crossed when `spent ≥ limit`; a block cap when `spent > limit`.
    pub fn after_settle(&self, session_settled: Money, daily_settled: Money) -> Vec<CapWarning> {
        let mut out = Vec::new();
        for (window, spent) in [
            (CapWindow::Session, session_settled),
            (CapWindow::Daily, daily_settled),
        ] {
            if let Some(limit) = self.warn(window).filter(|l| spent >= *l) {
                out.push(CapWarning {
                    cap: window,
                    level: CapLevel::Warn,
                    limit,
                    spent,
                });
            }
            if let Some(limit) = self.block(window).filter(|l| spent > *l) {
                out.push(CapWarning {
                    cap: window,
                    level: CapLevel::Block,
                    limit,
                    spent,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Money {
        Money::parse(s, "t").unwrap_or(Money::ZERO)
    }

    fn totals(settled: &str, held: &str) -> SpendTotals {
        SpendTotals {
            settled: m(settled),
            held: m(held),
        }
    }

    #[test]
    fn sc_16_preflight_counts_settled_and_held() {
        let caps = Caps {
            daily_block: Some(m("1.00")),
            ..Caps::default()
        };
        assert!(caps
            .admit(SpendTotals::default(), totals("0.5", "0.3"), m("0.2"))
            .is_ok());
        let blocked = caps.admit(SpendTotals::default(), totals("0.5", "0.3"), m("0.21"));
        assert!(matches!(
            blocked,
            Err(CapBlocked {
                window: CapWindow::Daily,
                ..
            })
        ));
    }

    #[test]
    fn sc_15_warn_crossed_at_limit_block_only_above() {
        let caps = Caps {
            session_warn: Some(m("0.5")),
            session_block: Some(m("1")),
            ..Caps::default()
        };
        let at = caps.after_settle(m("1"), m("1"));
        assert_eq!(at.len(), 1);
        assert_eq!(at[0].level, CapLevel::Warn);
        let above = caps.after_settle(m("1.01"), m("0"));
        assert!(above.iter().any(|w| w.level == CapLevel::Block));
    }
}
