import Foundation
import PushTransport

/// The `--config` file (JSON): several named credentials and the APNs endpoint. Flags and the
/// environment win over it; the `default` credential is the one APNS_KEY_* configure.
///
/// ```json
/// {
///   "apns_endpoint": "https://127.0.0.1:2197",
///   "apns_ca_file": "/etc/push-worker/simulator-ca.pem",
///   "credentials": {
///     "default": { "team_id": "DEF123GHIJ", "key_id": "ABC123DEFG", "key_path": "/etc/push-worker/AuthKey_ABC123DEFG.p8" },
///     "brand-b": { "team_id": "XYZ987WVUT", "key_id": "KLM456NOPQ", "key_path": "/etc/push-worker/AuthKey_KLM456NOPQ.p8" },
///     "legacy": { "type": "certificate", "p12_path": "/etc/push-worker/apns.p12", "password_file": "/etc/push-worker/apns.pass" },
///     "mdm": { "type": "certificate", "cert_path": "/etc/push-worker/mdm.pem", "key_path": "/etc/push-worker/mdm.key" },
///     "android": { "type": "fcm", "service_account_path": "/etc/push-worker/firebase-sa.json" }
///   }
/// }
/// ```
struct ConfigFile: Decodable {
    /// A token credential (`team_id`, `key_id`, `key_path` of a `.p8`), or with `"type": "certificate"` a
    /// provider certificate: `p12_path` (+ `password_file`), or `cert_path` + `key_path`.
    struct Credential: Decodable {
        var type: String?
        var teamID: String?
        var keyID: String?
        var keyPath: String?
        var p12Path: String?
        var certPath: String?
        var passwordFile: String?
        var serviceAccountPath: String?

        enum CodingKeys: String, CodingKey {
            case type
            case teamID = "team_id"
            case keyID = "key_id"
            case keyPath = "key_path"
            case p12Path = "p12_path"
            case certPath = "cert_path"
            case passwordFile = "password_file"
            case serviceAccountPath = "service_account_path"
        }

        var isCertificate: Bool { self.type == "certificate" }
        /// An FCM service account (`"type": "fcm"`).
        var isFCM: Bool { self.type == "fcm" }

        /// What is missing or contradictory, as a sentence; `nil` when the fields fit the type.
        var problem: String? {
            switch self.type {
            case nil, "token":
                if [self.teamID, self.keyID, self.keyPath].contains(where: { ($0 ?? "").isEmpty }) {
                    return
                        "needs team_id, key_id and key_path (a .p8 key), or \"type\": \"certificate\" with p12_path or cert_path + key_path"
                }
                if self.p12Path != nil || self.certPath != nil {
                    return "has p12_path or cert_path but no \"type\": \"certificate\": add it, or drop those fields"
                }
                return nil
            case "certificate":
                let hasP12 = !(self.p12Path ?? "").isEmpty
                let hasPEM = !(self.certPath ?? "").isEmpty && !(self.keyPath ?? "").isEmpty
                if hasP12 == hasPEM {
                    return
                        "is a certificate credential: set either p12_path (with password_file if the bundle has a password) or cert_path and key_path"
                }
                if self.teamID != nil || self.keyID != nil {
                    return
                        "is a certificate credential: team_id and key_id belong to token (.p8) credentials; drop them"
                }
                return nil
            case "fcm":
                if (self.serviceAccountPath ?? "").isEmpty {
                    return
                        "is an FCM credential: set service_account_path to the service account's JSON key file (Firebase console > Project settings > Service accounts)"
                }
                if [self.teamID, self.keyID, self.keyPath, self.p12Path, self.certPath].contains(where: { $0 != nil }) {
                    return "is an FCM credential: it takes service_account_path only; drop the APNs fields"
                }
                return nil
            default:
                return
                    "has type \"\(self.type!)\": use \"token\" (the default), \"certificate\" or \"fcm\""
            }
        }
    }

    var apnsEndpoint: String?
    var apnsCAFile: String?
    var fcmEndpoint: String?
    var fcmCAFile: String?
    var credentials: [String: Credential]

    enum CodingKeys: String, CodingKey {
        case apnsEndpoint = "apns_endpoint"
        case apnsCAFile = "apns_ca_file"
        case fcmEndpoint = "fcm_endpoint"
        case fcmCAFile = "fcm_ca_file"
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
            for (name, credential) in config.credentials.sorted(by: { $0.key < $1.key }) {
                if let problem = credential.problem {
                    throw CLIError("--config \(path): credential '\(name)' \(problem)")
                }
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

    /// Loads every token credential's key (each refused clearly if missing, world-readable or not P-256).
    func signingKeys() throws -> [String: SigningKey] {
        try self.credentials.filter { !$0.value.isCertificate && !$0.value.isFCM }.mapValues {
            try SigningKey.load(teamID: $0.teamID ?? "", keyID: $0.keyID ?? "", path: $0.keyPath ?? "")
        }
    }

    /// Loads every FCM credential's service account (each refused clearly if missing, readable by others,
    /// or not a service account key).
    func serviceAccounts() throws -> [String: ServiceAccount] {
        try self.credentials.filter { $0.value.isFCM }.mapValues {
            try ServiceAccount.load(path: $0.serviceAccountPath ?? "")
        }
    }

    /// Loads every certificate credential (each refused clearly if missing, unreadable, expired, or its key
    /// does not match).
    func certificates() throws -> [String: ClientCertificate] {
        try self.credentials.filter { $0.value.isCertificate }.mapValues { credential in
            if let p12 = credential.p12Path, !p12.isEmpty {
                return try ClientCertificate.loadPKCS12(
                    path: p12,
                    passwordFile: credential.passwordFile,
                    now: processClock.wallNow
                )
            }
            return try ClientCertificate.loadPEM(
                certificatePath: credential.certPath ?? "",
                keyPath: credential.keyPath ?? "",
                passwordFile: credential.passwordFile,
                now: processClock.wallNow
            )
        }
    }
}
