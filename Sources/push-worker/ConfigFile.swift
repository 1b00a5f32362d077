import APNsTransport
import Foundation

/// The `--config` file (JSON): several named credentials and the APNs endpoint. Flags and the
/// environment win over it; the `default` credential is the one APNS_KEY_* configure.
///
/// ```json
/// {
///   "apns_endpoint": "https://127.0.0.1:2197",
///   "apns_ca_file": "/etc/push-worker/simulator-ca.pem",
///   "credentials": {
///     "default": { "team_id": "DEF123GHIJ", "key_id": "ABC123DEFG", "key_path": "/etc/push-worker/AuthKey_ABC123DEFG.p8" },
///     "brand-b": { "team_id": "XYZ987WVUT", "key_id": "KLM456NOPQ", "key_path": "/etc/push-worker/AuthKey_KLM456NOPQ.p8" }
///   }
/// }
/// ```
struct ConfigFile: Decodable {
    struct Credential: Decodable {
        var teamID: String
        var keyID: String
        var keyPath: String

        enum CodingKeys: String, CodingKey {
            case teamID = "team_id"
            case keyID = "key_id"
            case keyPath = "key_path"
        }
    }

    var apnsEndpoint: String?
    var apnsCAFile: String?
    var credentials: [String: Credential]

    enum CodingKeys: String, CodingKey {
        case apnsEndpoint = "apns_endpoint"
        case apnsCAFile = "apns_ca_file"
        case credentials
    }

    /// Reads and checks the file; errors name the file and what to fix.
    static func load(_ path: String) throws -> ConfigFile {
        // It decides where payloads and provider tokens go: the same care as a key file.
        let data: Data
        switch SecretFile.read(path, policy: .configuration) {
        case .success(let bytes): data = Data(bytes)
        case .failure(let failure): throw CLIError("--config \(path) \(failure.sentence)")
        }
        do {
            let config = try JSONDecoder().decode(ConfigFile.self, from: data)
            for (name, credential) in config.credentials
            where credential.teamID.isEmpty || credential.keyID.isEmpty || credential.keyPath.isEmpty {
                throw CLIError("--config \(path): credential '\(name)' needs team_id, key_id and key_path")
            }
            // The same rule as push.jobs' credential column: a name no job could carry is a typo.
            for name in config.credentials.keys
            where name.isEmpty || name.utf8.count > 64
                || name.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
            {
                throw CLIError(
                    "--config \(path): credential name \(name.debugDescription) must be 1 to 64 bytes without control characters (push.jobs' credential column holds the same names)"
                )
            }
            return config
        } catch let error as CLIError {
            throw error
        } catch DecodingError.keyNotFound(let key, let context) {
            throw CLIError(
                "--config \(path): missing \"\(key.stringValue)\" at \(context.codingPath.map(\.stringValue).joined(separator: "."))"
            )
        } catch DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context) {
            throw CLIError(
                "--config \(path): wrong value at \(context.codingPath.map(\.stringValue).joined(separator: ".")): \(context.debugDescription)"
            )
        } catch {
            throw CLIError("--config \(path) is not valid JSON: \(error.localizedDescription)")
        }
    }

    /// Loads every credential's key (each refused clearly if missing, world-readable or not P-256).
    func signingKeys() throws -> [String: SigningKey] {
        try self.credentials.mapValues { try SigningKey.load(teamID: $0.teamID, keyID: $0.keyID, path: $0.keyPath) }
    }
}
