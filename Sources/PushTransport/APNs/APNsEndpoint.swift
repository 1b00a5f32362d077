public import PushCore

/// APNs' endpoints: the name the worker has always used, and Apple's hosts by environment.
public typealias APNsEndpoint = PushEndpoint

extension PushEndpoint {
    /// Apple's send endpoint for an environment.
    public static func apple(_ environment: APNsEnvironment, port: Int = 443) -> APNsEndpoint {
        APNsEndpoint(host: environment.sendHost, port: port)
    }

    /// Apple's channel-management endpoint for an environment.
    public static func appleChannels(_ environment: APNsEnvironment) -> APNsEndpoint {
        let (host, port) = environment.channelHost
        return APNsEndpoint(host: host, port: port)
    }
}
