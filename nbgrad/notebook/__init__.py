"""The notebook side: IPython magics, the magic line, `%nbgrad`, the sidebar's comm. The only room that
imports IPython."""
