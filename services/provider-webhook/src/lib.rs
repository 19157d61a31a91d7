//! Generic webhook IM provider (im.webhook)
