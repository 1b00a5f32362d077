import ArgumentParser
import PushQueue
@main struct Main: ParsableCommand { func run() {} }
