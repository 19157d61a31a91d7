//! Telegram Bot API provider (im.telegram).
