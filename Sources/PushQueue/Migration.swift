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
        Migration(
            version: 1,
            name: "0001_schema.sql",
            sql: String(decoding: PackageResources._001_schema_sql, as: UTF8.self)
        ),
        Migration(
            version: 2,
            name: "0002_provider_tokens.sql",
            sql: String(decoding: PackageResources._002_provider_tokens_sql, as: UTF8.self)
        ),
        Migration(
            version: 3,
            name: "0003_failure_paths.sql",
            sql: String(decoding: PackageResources._003_failure_paths_sql, as: UTF8.self)
        ),
        Migration(
            version: 4,
            name: "0004_hostile_input.sql",
            sql: String(decoding: PackageResources._004_hostile_input_sql, as: UTF8.self)
        ),
        Migration(
            version: 5,
            name: "0005_deliver_once.sql",
            sql: String(decoding: PackageResources._005_deliver_once_sql, as: UTF8.self)
        ),
    ]
}
