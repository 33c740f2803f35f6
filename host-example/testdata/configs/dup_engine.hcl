# want: 5:1 Duplicate engine block
engine {
  plugin_dir = "@PLUGIN_DIR@"
}
engine {
  listen = "127.0.0.1:0"
}
