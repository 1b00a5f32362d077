/// The runbook for trap ids: one source for `docs/runbook.md` ("Runbook: trap ids", checked equal by a
/// test) and the operator console's dead-letter advice.
public enum TrapRunbook {
    /// One entry: the codes it covers (its heading), a title, and the advice in Markdown.
    public struct Entry: Sendable, Hashable {
        /// The trap ids, e.g. `["MS020"]` or `["PW101", "PW102", "PW103"]`.
        public var codes: [String]
        public var title: String
        public var markdown: String
    }

    /// The text before the entries.
    public static let introduction = #"""
        Trap ids come from the Mobile Surfaces catalogue of APNs mistakes. A job's `trap_ids` lists each one
        met, in order. Dead letters keep them, and `push-worker dead list --trap <id>` finds them.
        """#

    /// Every entry, in the document's order.
    public static let entries: [Entry] = [
        Entry(
            codes: ["MS011"],
            title: "payload over the size limit",
            markdown: #"""
                4 KB for most push types, 5 KB for VoIP. Checked before sending (no request is made) and classified
                again if APNs answers `413 PayloadTooLarge`. Fix it in the producer; see
                [PushPayloadTooLarge](#pushpayloadtoolarge).
                """#
        ),
        Entry(
            codes: ["MS014"],
            title: "token environment must match the build environment",
            markdown: #"""
                `400 BadDeviceToken`: a development (sandbox) token sent to production, or the other way round. It
                can also be a malformed token (not 64+ hex characters), which is refused before sending. The job
                dies, and the token is recorded in `push.invalid_tokens`. Check the `environment` column against the
                app build that produced the token.
                """#
        ),
        Entry(
            codes: ["MS015"],
            title: "priority 5 vs 10 budget rules",
            markdown: #"""
                `429 TooManyRequests`: APNs is throttling. Jobs retry after `Retry-After`. Priority-10 jobs get
                fewer retries and wider backoff, so a throttled device is not hammered. Send priority 5 unless the
                user must see it now, and use `collapse_id` for repeated updates. See
                [PushTooManyRequestsBurst](#pushtoomanyrequestsburst).
                """#
        ),
        Entry(
            codes: ["MS018"],
            title: "bundle id must not carry the push-type suffix",
            markdown: #"""
                The `topic` column must be the bare bundle id (`com.example.app`). PushWorker adds the suffix the
                push type needs (`.voip`, `.push-type.liveactivity`, …). A topic that already carries a suffix is
                refused before sending. `400 TopicDisallowed` from APNs pauses the credential for that topic only:
                the key may not send to that bundle id; its other topics keep sending.
                """#
        ),
        Entry(
            codes: ["MS020"],
            title: "tokens rotate, drop a token after 410",
            markdown: #"""
                `410 Unregistered` or `ExpiredToken`: the app was uninstalled or the token replaced. The job dies
                (never retried), and the token goes to `push.invalid_tokens` with APNs' timestamp in milliseconds.
                Producers must delete the token. This is normal churn; see
                [PushStaleTokenRatioHigh](#pushstaletokenratiohigh).
                """#
        ),
        Entry(
            codes: ["MS028"],
            title: "APNs credentials must be configured before sending",
            markdown: #"""
                No key is configured for a job's `credential`. `push-worker run` with no key at all sends to the
                built-in simulator and says so on start. A worker claims only jobs whose credential it has a key for,
                so a job naming another credential waits in `pending` (no attempt used) for a worker that has it. If no
                running worker has it for `--credential-wait` (default 10 minutes), the job is dead-lettered with
                reason `CredentialsMissing`, trap MS028 and a sentence naming the credential; replay it once a worker
                has the key.
                """#
        ),
        Entry(
            codes: ["MS030"],
            title: "provider token must be valid and current",
            markdown: #"""
                A 403 about the provider token. There are three kinds, each with its own alert:
                [expired](#pushprovidertokenexpired) (re-minted automatically; a clock problem if it persists),
                [invalid](#pushprovidertokeninvalid) (wrong or revoked key; the credential pauses) and
                [forbidden](#pushproviderforbidden) (the key lacks the capability).
                """#
        ),
        Entry(
            codes: ["MS031"],
            title: "channel id missing, malformed or unregistered",
            markdown: #"""
                Broadcast (iOS 18) jobs: `MissingChannelId`, `BadChannelId` or `ChannelNotRegistered`. The job dies.
                Create the channel first (`push-worker channels create`) and store the returned id; list a bundle's
                channels with `push-worker channels list --bundle-id …`.
                """#
        ),
        Entry(
            codes: ["MS032"],
            title: "timestamps must be unix-seconds integers",
            markdown: #"""
                A Live Activity payload's `timestamp`, `stale-date` or `dismissal-date` is in milliseconds (≥ 1e11)
                or not a positive integer: refused before sending. APNs' `BadExpirationDate` is the same mistake in
                the expiration header. Send seconds.
                """#
        ),
        Entry(
            codes: ["MS034"],
            title: "broadcast capability must be enabled on the key",
            markdown: #"""
                `FeatureNotEnabled`: broadcast push is not enabled for this key or app. Enable it in the Apple
                Developer account, then replay.
                """#
        ),
        Entry(
            codes: ["PW101", "PW102", "PW103", "PW104", "PW105", "PW106", "PW107"],
            title: "payload warnings (sent anyway)",
            markdown: #"""
                APNs accepts these payloads, so the job is sent, but a device will not do what the producer meant. The code
                is in the job's `trap_ids`; fix the producer. PW101: `mutable-content: 1` with no visible alert (title,
                subtitle or body), so the notification service extension never runs; add an alert, or drop mutable-content
                for a silent push. PW102: an `interruption-level` other than `passive`, `active`, `time-sensitive` or
                `critical`; the device falls back to `active`. PW103: a `relevance-score` outside 0–1 on an alert (Live
                Activities may use any number); the device clamps it. PW104: a background push that carries `alert`,
                `sound` or `badge`; iOS drops or throttles it: send `content-available` alone, and what the user should
                see as an alert push. PW105: a Live Activity `start` without `alert`; the activity starts but is not
                shown on the lock screen. PW106: a Live Activity `timestamp` more than 8 hours ahead; iOS drops the
                update. PW107: a `sound` dictionary outside Apple's shape (`name`, `critical` 0 or 1, `volume` 0–1);
                the device plays a normal sound.

                ```sql
                SELECT trap, count(*) FROM push.jobs, unnest(trap_ids) AS trap
                 WHERE trap LIKE 'PW%' AND created_at > now() - interval '1 day' GROUP BY trap;
                ```
                """#
        ),
        Entry(
            codes: ["MS035"],
            title: "apns-topic missing",
            markdown: #"""
                `MissingTopic`: the job had no usable topic. Producers must set `topic` to the app's bundle id.
                """#
        ),
        Entry(
            codes: ["FC001", "FC002", "FC003"],
            title: "FCM payload not as FCM takes it",
            markdown: #"""
                Refused before sending; no request is made. An FCM job's `payload` is an FCM v1 message's fields
                without its target: `notification`, `data`, `android`, `fcm_options`. FC001: anything else (an APNs
                payload with `aps`, a `token`, `topic` or `condition`), or a field the worker sets from the job's
                columns (`android.priority` from `priority`, `android.ttl` from `expires_at`/`deliver_once`,
                `android.collapse_key` from `collapse_id`, `data.push_id` from `apns_id`). FC002: a `data` value
                that is not a string; FCM takes strings only, so encode numbers and objects as text. FC003: over
                FCM's 4,096 bytes. Fix the producer, then replay.
                """#
        ),
        Entry(
            codes: ["FC010"],
            title: "FCM registration token dead",
            markdown: #"""
                `404 UNREGISTERED`, or `400 INVALID_ARGUMENT` whose details name the token: the app was uninstalled,
                or the token was rotated or never valid. The job dies and the token is recorded in
                `push.invalid_tokens` (platform `fcm`); later jobs for it are dead-lettered unsent
                (`TokenInvalidated`). Drop the token from your store; the app gets a new one from FirebaseMessaging.
                """#
        ),
        Entry(
            codes: ["FC011"],
            title: "FCM token of another Firebase project",
            markdown: #"""
                `403 SENDER_ID_MISMATCH`: the token was issued for another Firebase project than the service
                account's. Check the job's `credential` names the service account of the app's project.
                """#
        ),
        Entry(
            codes: ["FC020"],
            title: "FCM quota spent",
            markdown: #"""
                `429 QUOTA_EXCEEDED` is about the message's target unless shown otherwise: one device over its own
                rate (Google: 240 messages a minute, 5,000 an hour per device) or a topic. That job alone waits
                (`Retry-After`, else 10 s doubling, using an attempt each time; then a dead letter), and the
                credential's other jobs go on. Send that device fewer messages (`coalesce_key` keeps only the
                latest of a kind). When the answer names the project's quota (a `QuotaFailure` whose subject is
                the project, or a `429` without FCM's own error code), or many distinct tokens get it at once (more
                than half of at least 20 answers within 10 s), the whole credential waits `Retry-After` (60 s when
                absent) and its jobs are resent without using an attempt: set a rate limit under the project's
                quota (`push-worker limits set --credential …`), or ask Google for more.
                """#
        ),
        Entry(
            codes: ["FC030"],
            title: "FCM service account refused",
            markdown: #"""
                A `401` the worker could not cure by minting a new access token, `403 PERMISSION_DENIED`, `404` for
                the project, or the token endpoint refusing the key: the credential's jobs
                stay pending with no attempt used, one log line per pause. Check the key file belongs to the
                project, that the service account has the Firebase Cloud Messaging API Admin role, and that the
                API is enabled; then the jobs go out by themselves.
                """#
        ),
        Entry(
            codes: ["FC031"],
            title: "FCM has no APNs key for an iOS token",
            markdown: #"""
                `401 THIRD_PARTY_AUTH_ERROR`: the token belongs to an iOS (or web) client of the Firebase project,
                and Firebase has no valid APNs auth key (or web push key) to pass the message on with. Only that
                job is dead-lettered; the credential's Android jobs go on, and
                `push_sends_total{platform="fcm",trap="FC031"}` counts them. Upload the APNs auth key in the
                Firebase console (Project settings, Cloud Messaging) and replay, or send to that device through
                APNs directly (`platform = 'apns'` with its APNs token).
                """#
        ),
        Entry(
            codes: ["FC040"],
            title: "FCM refused the message",
            markdown: #"""
                `400 INVALID_ARGUMENT` about the message rather than the token: a field FCM does not accept or a
                value out of range. The dead letter's `error` carries FCM's message; fix the producer, then replay.
                """#
        ),
    ]

    /// The entry covering `trapID`, if any.
    public static func entry(for trapID: String) -> Entry? {
        entries.first { $0.codes.contains(trapID) }
    }

    /// The whole section as `docs/runbook.md` holds it.
    public static var markdown: String {
        var text = "## Runbook: trap ids\n\n" + introduction + "\n"
        for entry in entries {
            text += "\n### " + entry.codes.joined(separator: ", ") + ": " + entry.title + "\n\n" + entry.markdown + "\n"
        }
        return text
    }
}
