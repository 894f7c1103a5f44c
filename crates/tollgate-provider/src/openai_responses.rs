//! openai_responses
