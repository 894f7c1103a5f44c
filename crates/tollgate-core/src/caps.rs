//! Money caps: warn and block levels, per session and per accounting day, per consumer.
//!
//! # Holds
//! A call's worst-case cost is **held** against every cap it is under, atomically with its claim.
//! A call is admitted only if `settled + held + its hold ≤ block` for every block cap, so parallel
//! calls can never pass a block cap together. Settlement releases the hold and adds the actual
//! cost; a post-call block (`settled > block`) is possible only when the actual cost exceeded the
//! worst case (a provider that ignored the output cap).

use crate::money::{Currency, Money};
use serde::{Deserialize, Serialize};

/// Which spend a cap is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapWindow {
    /// The consumer's spend in this session.
    Session,
    /// The consumer's spend on this accounting day.
    Daily,
    /// Everything charged (and held) under one operation root: its inclusive cost (ST-7).
    Root,
}

impl CapWindow {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Daily => "daily",
            Self::Root => "root",
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
    /// Root warn level (calls under an operation root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_warn: Option<Money>,
    /// Root block level, on the root's inclusive cost (ST-7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_block: Option<Money>,
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
#[error("{} block cap {limit} would be exceeded", window.as_str())]
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
    /// Currency of every amount, when the refusing runner knows it (SC-123).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<Currency>,
}

impl CapBlocked {
    /// What the cap leaves for a new hold: `limit − settled − held`, floored at zero (SC-123).
    pub fn available(&self) -> Money {
        self.limit
            .saturating_sub(self.settled)
            .saturating_sub(self.held)
    }

    /// The same refusal, naming the currency of its amounts.
    pub fn in_currency(self, currency: Currency) -> Self {
        Self {
            currency: Some(currency),
            ..self
        }
    }
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
            CapWindow::Root => self.root_block,
        }
    }

    fn warn(&self, window: CapWindow) -> Option<Money> {
        match window {
            CapWindow::Session => self.session_warn,
            CapWindow::Daily => self.daily_warn,
            CapWindow::Root => self.root_warn,
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
        self.admit_windows(
            &[(CapWindow::Session, session), (CapWindow::Daily, daily)],
            hold,
        )
    }

    /// Preflight of a call under an operation root: the root block cap on the root's inclusive
    /// cost (`charged + held + hold`, ST-7).
    ///
    /// # Errors
    /// The root block cap would be exceeded.
    pub fn admit_root(&self, root: SpendTotals, hold: Money) -> Result<(), CapBlocked> {
        self.admit_windows(&[(CapWindow::Root, root)], hold)
    }

    fn admit_windows(
        &self,
        windows: &[(CapWindow, SpendTotals)],
        hold: Money,
    ) -> Result<(), CapBlocked> {
        for &(window, totals) in windows {
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
                    currency: None,
                });
            }
        }
        Ok(())
    }

    /// After settlement: the warn caps crossed and the block caps exceeded, given settled spend.
    /// A warn cap counts as crossed when `spent ≥ limit`; a block cap when `spent > limit`.
    pub fn after_settle(&self, session_settled: Money, daily_settled: Money) -> Vec<CapWarning> {
        self.crossed(&[
            (CapWindow::Session, session_settled),
            (CapWindow::Daily, daily_settled),
        ])
    }

    /// After settlement under a root: the root caps crossed by its inclusive charged cost.
    pub fn after_settle_root(&self, root_charged: Money) -> Vec<CapWarning> {
        self.crossed(&[(CapWindow::Root, root_charged)])
    }

    fn crossed(&self, windows: &[(CapWindow, Money)]) -> Vec<CapWarning> {
        let mut out = Vec::new();
        for &(window, spent) in windows {
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
