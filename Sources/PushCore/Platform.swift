/// Which provider a job goes to: its `platform` column.
public enum Platform: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// Apple Push Notification service.
    case apns
    /// Firebase Cloud Messaging (Android), HTTP v1 API.
    case fcm

    public var description: String { self.rawValue }

    /// How logs, errors and the console name the provider.
    public var providerName: String {
        switch self {
        case .apns: "APNs"
        case .fcm: "FCM"
        }
    }
}
