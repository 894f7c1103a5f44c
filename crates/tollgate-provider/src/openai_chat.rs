//! openai_chat
