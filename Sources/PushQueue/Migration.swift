/// One numbered schema file from `sql/`, embedded in the binary.
public struct Migration: Sendable, Hashable {
    /// The number the file name starts with; migrations apply in this order.
    public var version: Int
    /// The file name, e.g. `0001_schema.sql`.
    public var name: String
    /// The file's text.
    public var sql: String

    /// Every migration this build knows, in order.
    public static let all: [Migration] = [
        ("0001_schema.sql", PackageResources._001_schema_sql),
        ("0002_provider_tokens.sql", PackageResources._002_provider_tokens_sql),
        ("0003_failure_paths.sql", PackageResources._003_failure_paths_sql),
        ("0004_hostile_input.sql", PackageResources._004_hostile_input_sql),
        ("0005_deliver_once.sql", PackageResources._005_deliver_once_sql),
        ("0006_flow_control.sql", PackageResources._006_flow_control_sql),
        ("0007_cheaper_checks.sql", PackageResources._007_cheaper_checks_sql),
        ("0008_fleet.sql", PackageResources._008_fleet_sql),
        ("0009_operator_truth.sql", PackageResources._009_operator_truth_sql),
        ("0010_fcm.sql", PackageResources._010_fcm_sql),
        ("0011_webhooks.sql", PackageResources._011_webhooks_sql),
        ("0012_traces.sql", PackageResources._012_traces_sql),
        ("0013_many_tenants.sql", PackageResources._013_many_tenants_sql),
        ("0014_neighbours.sql", PackageResources._014_neighbours_sql),
        ("0015_token_expiry.sql", PackageResources._015_token_expiry_sql),
        ("0016_rate_formula.sql", PackageResources._016_rate_formula_sql),
        ("0017_devices.sql", PackageResources._017_devices_sql),
        ("0018_recipients.sql", PackageResources._018_recipients_sql),
        ("0019_activities.sql", PackageResources._019_activities_sql),
    ]
    .map { name, bytes in
        // The version is the number the file name starts with.
        Migration(version: Int(name.prefix(4))!, name: name, sql: String(decoding: bytes, as: UTF8.self))
    }
}
