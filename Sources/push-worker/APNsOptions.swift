import APNsTransport
import ArgumentParser
import Foundation
import Logging
import PushCore

/// Where APNs is and which key signs: flags, then the environment (APNS_KEY_ID, APNS_TEAM_ID,
/// APNS_KEY_PATH, APNS_ENVIRONMENT).
struct APNsOptions: ParsableArguments {
    @Option(name: .customLong("apns-endpoint"), help: ArgumentHelp("Send to this APNs instead of Apple's (simulator, staging proxy), for both environments: https://host:port.", valueName: "url"))
    var endpoint: String?
    @Option(name: .customLong("apns-ca-file"), help: ArgumentHelp("Extra trusted CA certificate (PEM) for --apns-endpoint. TLS verification is never switched off.", valueName: "pem"))
    var caFile: String?
    @Option(name: .customLong("apns-key-path"), help: ArgumentHelp("The .p8 signing key (default: $APNS_KEY_PATH).", valueName: "path"))
    var keyPath: String?
    @Option(name: .customLong("apns-key-id"), help: ArgumentHelp("The key id (default: $APNS_KEY_ID).", valueName: "id"))
    var keyID: String?
    @Option(name: .customLong("apns-team-id"), help: ArgumentHelp("The team id (default: $APNS_TEAM_ID).", valueName: "id"))
    var teamID: String?
    @Option(name: .customLong("apns-environment"), help: ArgumentHelp("production or development, for verbs without a job (default: $APNS_ENVIRONMENT, else production).", valueName: "env"))
    var environmentName: String?

    var environment: APNsEnvironment {
        get throws {
            let name = self.environmentName ?? ProcessInfo.processInfo.environment["APNS_ENVIRONMENT"] ?? "production"
            guard let environment = APNsEnvironment(rawValue: name) else {
                throw ValidationError("APNs environment '\(name)' is neither production nor development")
            }
            return environment
        }
    }

    /// A client with the configured key as credential `default`.
    func makeClient(logger: Logger, base: APNsClient.Configuration = .init(), tokenStore: (any ProviderTokenStore)? = nil) throws -> APNsClient {
        let env = ProcessInfo.processInfo.environment
        guard let path = self.keyPath ?? env["APNS_KEY_PATH"], !path.isEmpty else {
            throw CLIError("no APNs key configured (trap MS028): set APNS_KEY_PATH, APNS_KEY_ID and APNS_TEAM_ID, or pass --apns-key-path, --apns-key-id and --apns-team-id")
        }
        let key = try SigningKey.load(teamID: self.teamID ?? env["APNS_TEAM_ID"] ?? "", keyID: self.keyID ?? env["APNS_KEY_ID"] ?? "", path: path)
        var configuration = base
        configuration.caFile = self.caFile
        if let endpoint = self.endpoint { configuration.endpointOverride = try APNsEndpoint(url: endpoint) }
        return try APNsClient(configuration: configuration, credentials: ["default": key], tokenStore: tokenStore, logger: logger)
    }
}
