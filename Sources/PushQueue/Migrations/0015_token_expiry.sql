-- Schema 15: a shared provider token says when it expires.
--
-- FCM access tokens live as long as the token endpoint says (`expires_in`: an hour at Google, less behind a
-- proxy or a stand-in). A worker that adopted another worker's token assumed an hour, and sent it after it had
-- expired: with 20 s tokens, 90 of 440 sends in 70 s were answered 401. The worker that obtains a token now
-- stores its expiry; the others renew it ahead of that instant. APNs provider tokens leave it NULL (Apple's
-- rule is an age, not an expiry).
ALTER TABLE push.provider_tokens ADD COLUMN IF NOT EXISTS expires_at timestamptz;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (15, '0015_token_expiry.sql') ON CONFLICT (version) DO NOTHING;
