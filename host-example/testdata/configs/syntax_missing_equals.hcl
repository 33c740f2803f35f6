# want: 4:23 Invalid block definition
engine {
  plugin_dir = "@PLUGIN_DIR@"
  listen "127.0.0.1:0"
}
