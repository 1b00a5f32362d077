import ArgumentParser
import Foundation
import Logging
import PushCore
import PushTransport

/// Where APNs is and which key signs: flags, then the environment (APNS_KEY_ID, APNS_TEAM_ID,
/// APNS_KEY_PATH, APNS_ENVIRONMENT).
struct APNsOptions: ParsableArguments {
    @Option(
        name: .customLong("apns-endpoint"),
        help: ArgumentHelp(
            "Send to this APNs instead of Apple's (simulator, staging proxy), for both environments: https://host:port.",
            valueName: "url"
        )
    )
    var endpoint: String?
    @Option(
        name: .customLong("apns-development-endpoint"),
        help: ArgumentHelp(
            "Send development jobs to this APNs instead (a stand-in for the sandbox host, api.sandbox.push.apple.com): https://host:port. Default: --apns-endpoint's.",
            valueName: "url"
        )
    )
    var developmentEndpoint: String?
    @Option(
        name: .customLong("apns-port"),
        help: ArgumentHelp(
            "The port of Apple's send hosts: 443 (default) or 2197, for networks that block outbound 443.",
            valueName: "port"
        )
    )
    var applePort: Int?
    @Option(
        name: .customLong("apns-ca-file"),
        help: ArgumentHelp(
            "Extra trusted CA certificate (PEM) for --apns-endpoint. TLS verification is never switched off.",
            valueName: "pem"
        )
    )
    var caFile: String?
    @Option(
        name: .customLong("fcm-endpoint"),
        help: ArgumentHelp(
            "Send FCM messages to this endpoint instead of fcm.googleapis.com (a stand-in): https://host:port. The token endpoint is each service account file's token_uri.",
            valueName: "url"
        )
    )
    var fcmEndpoint: String?
    @Option(
        name: .customLong("fcm-ca-file"),
        help: ArgumentHelp(
            "Extra trusted CA certificate (PEM) for --fcm-endpoint and the service accounts' token_uri. TLS verification is never switched off.",
            valueName: "pem"
        )
    )
    var fcmCAFile: String?
    @Option(
        name: .customLong("fcm-service-account"),
        help: ArgumentHelp(
            "The FCM service account's JSON key file for credential 'default' of platform fcm jobs (default: $FCM_SERVICE_ACCOUNT_PATH). It must not be readable by other users.",
            valueName: "path"
        )
    )
    var fcmServiceAccount: String?
    @Option(
        name: .customLong("apns-key-path"),
        help: ArgumentHelp("The .p8 signing key (default: $APNS_KEY_PATH).", valueName: "path")
    )
    var keyPath: String?
    @Option(
        name: .customLong("apns-key-id"),
        help: ArgumentHelp("The key id (default: $APNS_KEY_ID).", valueName: "id")
    )
    var keyID: String?
    @Option(
        name: .customLong("apns-team-id"),
        help: ArgumentHelp("The team id (default: $APNS_TEAM_ID).", valueName: "id")
    )
    var teamID: String?
    @Option(
        help: ArgumentHelp(
            "A JSON file naming several credentials (the jobs' credential column picks one) and the endpoint; flags and the environment win over it.",
            valueName: "path"
        )
    )
    var config: String?
    @Option(
        name: .customLong("apns-environment"),
        help: ArgumentHelp(
            "production or development, for verbs without a job (default: $APNS_ENVIRONMENT, else production).",
            valueName: "env"
        )
    )
    var environmentName: String?
    @Option(
        name: .customLong("https-proxy"),
        help: ArgumentHelp(
            "Reach APNs (sends and channel management), FCM and https:// webhook receivers through this HTTP CONNECT proxy: http://[user:password@]host:port (default: $HTTPS_PROXY). Hosts in $NO_PROXY connect directly. TLS to the provider or receiver runs inside the tunnel, fully verified; a receiver's tunnel goes to the address the worker resolved and checked, never a name.",
            valueName: "url"
        )
    )
    var httpsProxy: String?
    @Option(
        name: .customLong("https-proxy-auth-file"),
        help: ArgumentHelp(
            "A file holding the proxy's basic-auth user:password on one line (mode 600), instead of putting them in the URL.",
            valueName: "path"
        )
    )
    var httpsProxyAuthFile: String?

    /// The proxy from `--https-proxy` or `HTTPS_PROXY` (`https_proxy`), with `NO_PROXY` (`no_proxy`); `nil`
    /// when none is set.
    func proxy() throws -> HTTPSProxy? {
        let env = ProcessInfo.processInfo.environment
        let fromEnvironment = [env["HTTPS_PROXY"], env["https_proxy"]].compactMap { $0 }.first { !$0.isEmpty }
        guard let url = self.httpsProxy ?? fromEnvironment, !url.isEmpty else {
            if self.httpsProxyAuthFile != nil {
                throw CLIError("--https-proxy-auth-file needs --https-proxy (or HTTPS_PROXY) to name the proxy")
            }
            return nil
        }
        return try HTTPSProxy(
            url: url,
            credentialsFile: self.httpsProxyAuthFile,
            noProxy: [env["NO_PROXY"], env["no_proxy"]].compactMap { $0 }.first { !$0.isEmpty }
        )
    }

    var environment: APNsEnvironment {
        get throws {
            let name = self.environmentName ?? ProcessInfo.processInfo.environment["APNS_ENVIRONMENT"] ?? "production"
            guard let environment = APNsEnvironment(rawValue: name) else {
                throw ValidationError("APNs environment '\(name)' is neither production nor development")
            }
            return environment
        }
    }

    /// Whether any signing key is configured (flags, environment or config file). A key setting that is
    /// present but empty (an unresolved template, `APNS_KEY_PATH=`) is an error naming it, never "no key".
    var hasKey: Bool {
        get throws {
            let env = ProcessInfo.processInfo.environment
            for (name, flag, value) in [
                ("APNS_KEY_PATH", "--apns-key-path", self.keyPath ?? env["APNS_KEY_PATH"]),
                ("APNS_KEY_ID", "--apns-key-id", self.keyID ?? env["APNS_KEY_ID"]),
                ("APNS_TEAM_ID", "--apns-team-id", self.teamID ?? env["APNS_TEAM_ID"]),
                ("--config", "--config", self.config),
                (
                    "FCM_SERVICE_ACCOUNT_PATH", "--fcm-service-account",
                    self.fcmServiceAccount ?? env["FCM_SERVICE_ACCOUNT_PATH"]
                ),
            ] {
                if let value, value.trimmingCharacters(in: .whitespaces).isEmpty {
                    throw CLIError(
                        "\(name == flag ? flag : "\(name) (or \(flag))") is set but empty: set it to the real value (an unresolved template or secret?), or unset it"
                    )
                }
            }
            return self.keyPath ?? env["APNS_KEY_PATH"] != nil || self.config != nil
                || self.fcmServiceAccount ?? env["FCM_SERVICE_ACCOUNT_PATH"] != nil
        }
    }

    /// Every configured credential, loaded and checked, by name, with the config file they came from.
    struct Credentials {
        var file: ConfigFile?
        /// Token credentials (.p8 signing keys).
        var keys: [String: SigningKey]
        /// Certificate credentials.
        var certificates: [String: ClientCertificate]
        /// FCM credentials (service accounts).
        var serviceAccounts: [String: ServiceAccount] = [:]
    }

    /// Every configured key and certificate, loaded and checked (file permissions, key type, ids, expiry),
    /// by credential name, with the config file they came from; connects to nothing.
    func credentials() throws -> Credentials {
        _ = try self.hasKey  // an empty key setting is an error naming it
        let env = ProcessInfo.processInfo.environment
        let file = try self.config.map(ConfigFile.load)
        var keys = try file?.signingKeys() ?? [:]
        var certificates = try file?.certificates() ?? [:]
        if let path = self.keyPath ?? env["APNS_KEY_PATH"], !path.isEmpty {
            keys["default"] = try SigningKey.load(
                teamID: self.teamID ?? env["APNS_TEAM_ID"] ?? "",
                keyID: self.keyID ?? env["APNS_KEY_ID"] ?? "",
                path: path
            )
            certificates["default"] = nil
        }
        // FCM's credentials are apart from APNs' (an fcm job's environment is 'fcm'): 'default' may name
        // an APNs key (APNS_KEY_PATH) and a service account (FCM_SERVICE_ACCOUNT_PATH) at once.
        var serviceAccounts = try file?.serviceAccounts() ?? [:]
        if let path = self.fcmServiceAccount ?? env["FCM_SERVICE_ACCOUNT_PATH"], !path.isEmpty {
            serviceAccounts["default"] = try ServiceAccount.load(path: path)
        }
        guard !keys.isEmpty || !certificates.isEmpty || !serviceAccounts.isEmpty else {
            throw CLIError(
                "no APNs key configured (trap MS028): set APNS_KEY_PATH, APNS_KEY_ID and APNS_TEAM_ID, pass --apns-key-path, --apns-key-id and --apns-team-id, or name credentials in --config"
            )
        }
        return Credentials(file: file, keys: keys, certificates: certificates, serviceAccounts: serviceAccounts)
    }

    /// A client with every configured key: the config file's credentials, and `default` from the flags
    /// or APNS_KEY_PATH/APNS_KEY_ID/APNS_TEAM_ID (which win over the file's `default`).
    func makeClient(
        logger: Logger,
        base: APNsClient.Configuration = .init(),
        tokenStore: (any ProviderTokenStore)? = nil
    ) throws -> APNsClient {
        let loaded = try self.credentials()
        var configuration = base
        configuration.clock = processClock
        configuration.caFile = self.caFile ?? loaded.file?.apnsCAFile
        if let port = self.applePort {
            guard port == 443 || port == 2197 else {
                throw CLIError(
                    "--apns-port \(port): Apple's send hosts listen on 443 and 2197 only; for another APNs use --apns-endpoint https://host:port"
                )
            }
            configuration.applePort = port
        }
        if let endpoint = self.endpoint ?? loaded.file?.apnsEndpoint {
            configuration.endpointOverride = try APNsEndpoint(url: endpoint)
        }
        if let endpoint = self.developmentEndpoint {
            configuration.developmentEndpointOverride = try APNsEndpoint(url: endpoint)
        }
        configuration.httpsProxy = try self.proxy()
        if let proxy = configuration.httpsProxy {
            logger.info(
                "APNs connections go through an HTTPS proxy",
                metadata: ["push.proxy": "\(proxy)", "push.no_proxy": "\(proxy.noProxy.joined(separator: ","))"]
            )
        }
        for (name, certificate) in loaded.certificates.sorted(by: { $0.key < $1.key }) {
            let days = Int(certificate.notValidAfter.timeIntervalSinceNow / 86_400)
            logger.log(
                level: days < 30 ? .warning : .info,
                days < 30 ? "APNs certificate expires soon: renew it" : "APNs certificate credential",
                metadata: [
                    "push.credential": "\(name)", "push.certificate": "\(certificate.commonName)",
                    "push.topic": "\(certificate.topic ?? "-")", "push.expires_in_days": "\(days)",
                ]
            )
        }
        return try APNsClient(
            configuration: configuration,
            credentials: loaded.keys,
            certificates: loaded.certificates,
            tokenStore: tokenStore,
            logger: logger
        )
    }

    /// FCM's client with every configured service account, or `nil` when none is configured.
    func makeFCMClient(
        logger: Logger,
        base: FCMClient.Configuration = .init(),
        tokenStore: (any ProviderTokenStore)? = nil
    ) throws -> FCMClient? {
        let loaded = try self.credentials()
        guard !loaded.serviceAccounts.isEmpty else { return nil }
        var configuration = base
        configuration.clock = processClock
        configuration.caFile = self.fcmCAFile ?? loaded.file?.fcmCAFile ?? configuration.caFile
        if let endpoint = self.fcmEndpoint ?? loaded.file?.fcmEndpoint {
            configuration.endpointOverride = try PushEndpoint(url: endpoint, flag: "--fcm-endpoint")
        }
        configuration.httpsProxy = try self.proxy()
        for (name, account) in loaded.serviceAccounts.sorted(by: { $0.key < $1.key }) {
            logger.info(
                "FCM credential",
                metadata: [
                    "push.credential": "\(name)", "push.project": "\(account.projectID)",
                    "push.account": "\(account.clientEmail)",
                ]
            )
        }
        return try FCMClient(
            configuration: configuration,
            accounts: loaded.serviceAccounts,
            tokenStore: tokenStore,
            logger: logger
        )
    }
}
