# frozen_string_literal: true

# The one place the compiled extension (lib/serval/serval_ext.so) is
# required. When it is missing or was built for another Ruby, the LoadError
# says what to run instead of only "cannot load such file".
begin
  require "serval/serval_ext"
rescue LoadError => e
  raise unless e.path.to_s.include?("serval_ext") || e.message.include?("serval_ext")

  root = File.expand_path("../..", __dir__)
  raise LoadError, <<~MSG.chomp
    serval: the native extension is not built for this Ruby (#{RUBY_VERSION}): #{e.message}
      Serval was loaded from #{root}. Build the extension there:
        cd #{root} && bundle install && bundle exec rake compile
      (A Gemfile `path:` source does not compile extensions; a `git:` source or the gem does.
      After switching Ruby versions, delete lib/serval/serval_ext.so first.)
  MSG
end
