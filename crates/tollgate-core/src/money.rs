//! Exact money and versioned price tables.
//!
//! # Rounding rule
//! Prices are per million tokens with at most [`PRICE_SCALE_MAX`] fraction digits, so
//! `tokens × price / 1,000,000` is exact at [`AMOUNT_SCALE`] fraction digits: **no amount is
//! ever rounded**. Amounts are stored as `NUMERIC(38, 12)`. A price with more fraction digits is
//! rejected when the table is loaded, never silently rounded.

use crate::usage::Usage;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Most fraction digits a per-million-token price may carry.
pub const PRICE_SCALE_MAX: u32 = 6;
/// Fraction digits of every stored amount.
pub const AMOUNT_SCALE: u32 = 12;
/// Largest accepted price per million tokens (guards against typos that would overflow caps).
pub const PRICE_PER_MTOK_MAX: i64 = 1_000_000;
const TOKENS_PER_PRICE_UNIT: i64 = 1_000_000;

/// An ISO-4217-like currency code (three upper-case ASCII letters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Currency(String);

impl Currency {
    /// Parses a three-letter upper-case code.
    ///
    /// # Errors
    /// Anything but three ASCII upper-case letters.
    pub fn parse(code: &str) -> Result<Self, MoneyError> {
        if code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase()) {
            Ok(Self(code.to_string()))
        } else {
            Err(MoneyError::Currency(code.chars().take(8).collect()))
        }
    }

    /// The code.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Currency {
    type Error = MoneyError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<Currency> for String {
    fn from(value: Currency) -> String {
        value.0
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Errors of money and price handling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    /// Not a currency code.
    #[error("invalid currency code {0:?}")]
    Currency(String),
    /// A negative amount or price.
    #[error("{0} must not be negative")]
    Negative(&'static str),
    /// Too many fraction digits.
    #[error("{field} has more than {max} fraction digits")]
    Scale {
        /// Which value.
        field: &'static str,
        /// The limit.
        max: u32,
    },
    /// A price above [`PRICE_PER_MTOK_MAX`].
    #[error("{0} is above the price limit")]
    TooLarge(&'static str),
    /// Not a decimal number.
    #[error("{0} is not a decimal number")]
    NotDecimal(&'static str),
    /// Arithmetic overflow (never silently saturated).
    #[error("amount overflow")]
    Overflow,
    /// An amount in one currency met a cap or total in another: nothing is added up across
    /// currencies (SC-106).
    #[error("currency mismatch: expected {expected}, found {found}")]
    CurrencyMismatch {
        /// The currency of the cap or total.
        expected: Currency,
        /// The currency of the spend or amount.
        found: Currency,
    },
    /// A subtraction would go below zero (never floored, SC-107).
    #[error("amount underflow")]
    Underflow,
    /// The price table has no entry for the model.
    #[error("price version {version} has no prices for model {model}")]
    Unpriced {
        /// Price version.
        version: String,
        /// Model name.
        model: String,
    },
}

/// An exact, non-negative amount of money at [`AMOUNT_SCALE`] fraction digits at most.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Money(#[serde(with = "rust_decimal::serde::str")] Decimal);

impl Money {
    /// Zero: what a proven refusal settles for.
    pub const ZERO: Money = Money(Decimal::ZERO);

    /// Wraps a decimal, checking sign and scale.
    ///
    /// # Errors
    /// Negative, or more than [`AMOUNT_SCALE`] fraction digits.
    pub fn new(value: Decimal, field: &'static str) -> Result<Self, MoneyError> {
        if value.is_sign_negative() && !value.is_zero() {
            return Err(MoneyError::Negative(field));
        }
        if value.normalize().scale() > AMOUNT_SCALE {
            return Err(MoneyError::Scale {
                field,
                max: AMOUNT_SCALE,
            });
        }
        Ok(Self(value.normalize()))
    }

    /// Parses a decimal string such as `"10.00"`.
    ///
    /// # Errors
    /// Not a decimal, negative, or too many fraction digits.
    pub fn parse(text: &str, field: &'static str) -> Result<Self, MoneyError> {
        let value: Decimal = text
            .trim()
            .parse()
            .map_err(|_| MoneyError::NotDecimal(field))?;
        Self::new(value, field)
    }

    /// The decimal value.
    pub fn decimal(&self) -> Decimal {
        self.0
    }

    /// Checked sum.
    ///
    /// # Errors
    /// Overflow.
    pub fn checked_add(self, other: Money) -> Result<Money, MoneyError> {
        self.0
            .checked_add(other.0)
            .map(|d| Money(d.normalize()))
            .ok_or(MoneyError::Overflow)
    }

    /// Checked difference: never floored at zero (SC-107).
    ///
    /// # Errors
    /// [`MoneyError::Underflow`] when `other` is more than `self`.
    pub fn checked_sub(self, other: Money) -> Result<Money, MoneyError> {
        if other.0 > self.0 {
            return Err(MoneyError::Underflow);
        }
        self.0
            .checked_sub(other.0)
            .map(|d| Money(d.normalize()))
            .ok_or(MoneyError::Underflow)
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.normalize().fmt(f)
    }
}

/// Prices of one model per million tokens, by token class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenPrices {
    /// Uncached input.
    pub input: Money,
    /// Visible output.
    pub output: Money,
    /// Per million input tokens read from the provider's prompt cache.
    pub cache_read: Money,
    /// Per million input tokens written to the provider's prompt cache.
    pub cache_write: Money,
    /// Per million reasoning (thinking) tokens, which `output` excludes.
    pub reasoning: Money,
}

impl TokenPrices {
    /// Checks every price's scale and magnitude.
    ///
    /// # Errors
    /// A price with more than [`PRICE_SCALE_MAX`] fraction digits or above the limit.
    pub fn validate(&self) -> Result<(), MoneyError> {
        for (field, price) in [
            ("input price", self.input),
            ("output price", self.output),
            ("cache_read price", self.cache_read),
            ("cache_write price", self.cache_write),
            ("reasoning price", self.reasoning),
        ] {
            if price.decimal().scale() > PRICE_SCALE_MAX {
                return Err(MoneyError::Scale {
                    field,
                    max: PRICE_SCALE_MAX,
                });
            }
            if price.decimal() > Decimal::from(PRICE_PER_MTOK_MAX) {
                return Err(MoneyError::TooLarge(field));
            }
        }
        Ok(())
    }

    /// The exact cost of `usage`.
    ///
    /// # Errors
    /// Overflow.
    pub fn cost(&self, usage: &Usage) -> Result<Money, MoneyError> {
        let mut total = Decimal::ZERO;
        for (tokens, price) in [
            (usage.input, self.input),
            (usage.output, self.output),
            (usage.cache_read, self.cache_read),
            (usage.cache_write, self.cache_write),
            (usage.reasoning, self.reasoning),
        ] {
            let part = Decimal::from(tokens)
                .checked_mul(price.decimal())
                .ok_or(MoneyError::Overflow)?;
            total = total.checked_add(part).ok_or(MoneyError::Overflow)?;
        }
        let amount = total
            .checked_div(Decimal::from(TOKENS_PER_PRICE_UNIT))
            .ok_or(MoneyError::Overflow)?;
        Money::new(amount, "amount")
    }

    /// The most one input token can cost (any input class).
    pub fn input_max(&self) -> Money {
        self.input.max(self.cache_read).max(self.cache_write)
    }

    /// The most one generated token can cost (output or reasoning).
    pub fn output_max(&self) -> Money {
        self.output.max(self.reasoning)
    }
}

/// One immutable, versioned price table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceTable {
    /// The table's version id.
    pub version: String,
    /// Currency of every price.
    pub currency: Currency,
    /// Prices by model name.
    pub models: BTreeMap<String, TokenPrices>,
}

impl PriceTable {
    /// Validates every price.
    ///
    /// # Errors
    /// The first invalid price.
    pub fn validate(&self) -> Result<(), MoneyError> {
        self.models.values().try_for_each(TokenPrices::validate)
    }

    /// Prices of `model`.
    ///
    /// # Errors
    /// [`MoneyError::Unpriced`] when the model is not in the table.
    pub fn prices(&self, model: &str) -> Result<&TokenPrices, MoneyError> {
        self.models.get(model).ok_or_else(|| MoneyError::Unpriced {
            version: self.version.clone(),
            model: model.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Money {
        Money::parse(s, "test").unwrap_or(Money::ZERO)
    }

    fn prices() -> TokenPrices {
        TokenPrices {
            input: m("1.00"),
            output: m("2.00"),
            cache_read: m("0.10"),
            cache_write: m("1.25"),
            reasoning: m("2.00"),
        }
    }

    #[test]
    fn cost_is_exact_per_class() {
        let usage = Usage {
            input: 1,
            output: 3,
            cache_read: 7,
            cache_write: 11,
            reasoning: 13,
        };
        // 1*1 + 3*2 + 7*0.1 + 11*1.25 + 13*2 = 1 + 6 + 0.7 + 13.75 + 26 = 47.45 per million
        assert_eq!(prices().cost(&usage), Ok(m("0.00004745")));
    }

    #[test]
    fn smallest_price_times_one_token_is_exact() {
        let mut p = prices();
        p.input = m("0.000001");
        let usage = Usage {
            input: 1,
            ..Usage::ZERO
        };
        assert_eq!(
            p.cost(&usage).map(|c| c.to_string()),
            Ok("0.000000000001".into())
        );
    }

    #[test]
    fn prices_with_too_many_digits_are_rejected() {
        let mut p = prices();
        p.output = m("0.0000001");
        assert!(matches!(p.validate(), Err(MoneyError::Scale { .. })));
    }

    #[test]
    fn negative_money_is_rejected() {
        assert_eq!(Money::parse("-1", "cap"), Err(MoneyError::Negative("cap")));
        assert!(Money::parse("abc", "cap").is_err());
    }

    #[test]
    fn sc_107_subtraction_below_zero_is_an_error_not_zero() {
        assert_eq!(m("1.5").checked_sub(m("0.5")), Ok(m("1")));
        assert_eq!(m("1").checked_sub(m("1")), Ok(Money::ZERO));
        assert_eq!(
            m("1").checked_sub(m("1.000000000001")),
            Err(MoneyError::Underflow)
        );
    }

    #[test]
    fn money_serializes_as_string() {
        assert_eq!(
            serde_json::to_string(&m("0.50")).ok(),
            Some("\"0.5\"".into())
        );
    }
}
