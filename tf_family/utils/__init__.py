"""Where the user's input meets the package: reading and writing the user's files safely (`files`), and what a user's
mistake looks like on the command line (`user_errors`)."""
