-- Whether the stored token t may be replaced by the one being saved (provider_tokens.sql, save).
(t.issued_at <= excluded.issued_at - make_interval(secs => :minimum_refresh_seconds)
 OR t.issued_at > now() + interval '60 seconds' OR t.expires_at <= now())
