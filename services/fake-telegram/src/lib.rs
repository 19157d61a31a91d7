//! A fake Telegram Bot API server.
