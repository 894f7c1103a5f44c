//! The request-fit budget: how much input fits a context window once the output cap, a
//! reserve and a safety margin are set aside. A request past it is refused before it is sent,
//! since the provider would reject it (H-6).

/// Tokens kept free for the answer when the output cap would squeeze it out.
pub const RESERVE_TOKENS: u64 = 16_384;
/// Safety margin for tokenizer and framing differences.
pub const SAFETY_TOKENS: u64 = 2_048;

/// The effective output cap and input limit of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFit {
    /// `O_eff`: `O` if `C − O − S ≥ R`, else `min(O, R)`.
    pub output_tokens_effective: u64,
    /// `L = max(1, min(floor(0.95·C), C − R, C − O_eff − S))` (saturating at 0 before the max).
    pub input_tokens_max: u64,
}

/// Computes the budget for context window `context_tokens` (C) and output cap `output_tokens` (O).
pub fn request_fit(context_tokens: u64, output_tokens: u64) -> RequestFit {
    let c = context_tokens;
    let o = output_tokens;
    let fits_with_reserve = c
        .checked_sub(o)
        .and_then(|rest| rest.checked_sub(SAFETY_TOKENS))
        .is_some_and(|rest| rest >= RESERVE_TOKENS);
    let o_eff = if fits_with_reserve {
        o
    } else {
        o.min(RESERVE_TOKENS)
    };
    let ninety_five = c.saturating_mul(95) / 100;
    let without_reserve = c.saturating_sub(RESERVE_TOKENS);
    let without_output = c.saturating_sub(o_eff).saturating_sub(SAFETY_TOKENS);
    let l = ninety_five.min(without_reserve).min(without_output).max(1);
    RequestFit {
        output_tokens_effective: o_eff,
        input_tokens_max: l,
    }
}

/// Whether a request of `input_tokens_estimate` fits; a request that does not is never sent
/// (`not_dispatched`, cause `invalid`).
pub fn fits(context_tokens: u64, output_tokens: u64, input_tokens_estimate: u64) -> bool {
    input_tokens_estimate <= request_fit(context_tokens, output_tokens).input_tokens_max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h_6_worked_example() {
        let fit = request_fit(131_072, 16_384);
        assert_eq!(fit.output_tokens_effective, 16_384);
        assert_eq!(fit.input_tokens_max, 112_640);
    }

    #[test]
    fn h_6_output_cap_squeezed_to_reserve() {
        // C − O − S < R: O_eff = min(O, R).
        let fit = request_fit(32_768, 30_000);
        assert_eq!(fit.output_tokens_effective, 16_384);
        // min(31129, 16384, 32768-16384-2048 = 14336) = 14336
        assert_eq!(fit.input_tokens_max, 14_336);
    }

    #[test]
    fn h_6_tiny_window_still_allows_one_token() {
        assert_eq!(request_fit(100, 50).input_tokens_max, 1);
        assert!(!fits(100, 50, 2));
        assert!(fits(131_072, 16_384, 112_640));
        assert!(!fits(131_072, 16_384, 112_641));
    }
}
