# want: 5:3 Unsupported argument
engine {
  listen     = "127.0.0.1:0"
  plugin_dir = "@PLUGIN_DIR@"
  listne     = "127.0.0.1:1"
}
